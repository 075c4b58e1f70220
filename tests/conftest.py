import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def cpu_measurement(tmp_path_factory) -> tuple[str, str] | None:
    """This CPU's matmul rates as `auto` precision and MFU keep them (train/cpu.py): measured once
    per test process, as a user's GPTRAIN_HOME keeps them across runs, instead of by every job's
    every worker in its new home (~2.5 s each). (file name, JSON), or None when the machine was
    too busy for a steady measurement: then each run measures, as before."""
    home = tmp_path_factory.mktemp("cpu-home")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GPTRAIN_HOME", str(home))
        from gptrain.train import cpu

        for _ in range(2):
            cpu._THIS_PROCESS.clear()
            if cpu.profile(("fp32", "bf16"))["kept"]:
                kept = next((home / "cache").glob("cpu-*.json"))
                return kept.name, kept.read_text()
    return None


@pytest.fixture(autouse=True)
def isolated_home(tmp_path, tmp_path_factory, monkeypatch, request):
    """Every test gets its own GPTRAIN_HOME (beside its tmp_path, not in it), so tests never see
    each other's jobs or datasets; the CPU measurement of this process is in its cache already (a
    test marked `cpu_unmeasured` sees no home until gptrain makes one)."""
    home = tmp_path_factory.mktemp("gptrain-home", numbered=True) / "home"
    if request.node.get_closest_marker("cpu_unmeasured") is None:
        kept = request.getfixturevalue("cpu_measurement")
        if kept is not None:
            home.mkdir(mode=0o700)  # as gptrain makes it (home.make_private)
            (home / "cache").mkdir(mode=0o700)
            path = home / "cache" / kept[0]
            path.write_text(kept[1])
            os.chmod(path, 0o600)
    monkeypatch.setenv("GPTRAIN_HOME", str(home))
    monkeypatch.setenv("GPTRAIN_CACHE_DIR", str(tmp_path / "node-cache"))  # this host's shard cache
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_VERBOSITY", "error")
    return home


def save_tiny_hf_gpt2(out, n_layer=2):
    """A tiny random GPT2LMHeadModel saved by transformers itself (safetensors)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=50257, n_positions=64, n_embd=32, n_layer=n_layer, n_head=4,
                     bos_token_id=50256, eos_token_id=50256)
    GPT2LMHeadModel(cfg).eval().save_pretrained(out)
    return out


def save_tiny_hf_llama(out, n_layer=2):
    """A tiny random LlamaForCausalLM (grouped-query attention, untied head) saved by
    transformers itself, with a tokenizer.json tokenizer beside it (GPT-2's BPE: the Llama
    tokenizer is not installable offline; any HF tokenizer directory works the same)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from gptrain.tokenizers import ASSETS

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=50257, hidden_size=32, intermediate_size=88, num_hidden_layers=n_layer,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      rope_theta=500.0, rms_norm_eps=1e-5, bos_token_id=50256, eos_token_id=50256,
                      tie_word_embeddings=False)
    LlamaForCausalLM(cfg).eval().save_pretrained(out)
    bpe = Tokenizer(models.BPE.from_file(str(ASSETS / "gpt2_vocab.json"), str(ASSETS / "gpt2_merges.txt")))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>").save_pretrained(out)
    return out


def save_tiny_hf_neox(out, n_layer=2, vocab=96):
    """A tiny random GPTNeoXForCausalLM (a family gptrain has no spec for: the generic path),
    saved by transformers itself; its vocabulary holds the char datasets' ids."""
    import torch
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    torch.manual_seed(0)
    cfg = GPTNeoXConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=n_layer, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=64, hidden_dropout=0.0, attention_dropout=0.0)
    GPTNeoXForCausalLM(cfg).eval().save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def tiny_hf_gpt2(tmp_path_factory):
    return save_tiny_hf_gpt2(tmp_path_factory.mktemp("hf") / "tiny-gpt2")


@pytest.fixture(scope="session")
def tiny_hf_llama(tmp_path_factory):
    return save_tiny_hf_llama(tmp_path_factory.mktemp("hf") / "tiny-llama")


@pytest.fixture(scope="session")
def tiny_hf_neox(tmp_path_factory):
    return save_tiny_hf_neox(tmp_path_factory.mktemp("hf") / "tiny-neox")


@pytest.fixture(scope="session")
def data(tmp_path_factory):
    """A small prepared char dataset (tests/helpers.make_dataset), made once per test process and
    only read: a test that changes or damages a dataset copies it first."""
    from tests.helpers import make_dataset

    return make_dataset(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="session")
def tiny_run(data, tmp_path_factory):
    """A tiny finished run on `data` (fp32, 2 rows a step, no evaluation) with checkpoints at steps
    2 and 4: its output folder, only read (tests that damage a checkpoint copy it first)."""
    from tests.helpers import TINY, train

    out = tmp_path_factory.mktemp("tiny-run") / "run"
    train(f"--data.path={data}", f"--train.output_dir={out}", "--train.max_steps=4", *TINY, "--train.batch_size=2",
          "--train.do_eval=false", "--train.precision=fp32", "--checkpoint.every=2")
    return out


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    """serve(make, **server_kw) -> (root, server): a new folder filled by make(root), served over
    HTTP (tests/byte_counting.ByteCountingServer: bytes counted per client) until the module ends;
    the one owner of the tests' dataset servers (each module's `served` says what it holds)."""
    from tests.byte_counting import ByteCountingServer

    servers = []

    def start(make, **server_kw):
        root = tmp_path_factory.mktemp("served")
        make(root)
        servers.append(ByteCountingServer(root, **server_kw))
        return root, servers[-1]

    yield start
    for server in servers:
        server.close()


@pytest.fixture
def slots(isolated_home, monkeypatch):
    """Two local CPU slots, one thread each, for real jobs; no supervisor left behind."""
    from tests.job_helpers import stop_all

    monkeypatch.setenv("GPTRAIN_LOCAL_SLOTS", "2")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    yield
    stop_all()


@pytest.fixture
def dataset(slots, tmp_path):
    """Two local slots and a tiny char dataset pushed as "tiny" (its name is the fixture's value)."""
    from tests.helpers import make_dataset

    assert run_cli("data", "push", "tiny", make_dataset(tmp_path)).returncode == 0
    return "tiny"


def run_cli(*args, env=None, cwd=None, timeout=600):
    """`gptrain ARGS` as a process of its own (tests/cli_process.py: forked from a server that has
    imported torch once); returns a CompletedProcess."""
    from tests import cli_process

    full_env = dict(os.environ)
    full_env.update(env or {})
    return cli_process.run(list(args), full_env, cwd=cwd, timeout=timeout)


# `make test` runs the suite on two pytest-xdist workers (`-n 2 --dist loadgroup`). A worker takes
# whole groups: a test file (its module fixtures are built once), or a whole folder whose tests
# share one session cluster (the Slurm cluster, the Ray cluster, the podman hosts), so each cluster
# is started once, by one worker.
SHARED_CLUSTER_DIRS = {"slurm", "ray", "hosts"}


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the marks into the test ids
def pytest_collection_modifyitems(config, items):
    for item in items:
        rel = Path(str(item.fspath)).resolve().relative_to(ROOT / "tests")
        group = rel.parts[0] if rel.parts[0] in SHARED_CLUSTER_DIRS else rel.as_posix()
        item.add_marker(pytest.mark.xdist_group(name=group))


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session):
    """Under --dist loadgroup every test id must carry its group by now (xdist appends it); where a
    pytest/xdist pairing stops doing that (pytest 9.2 with xdist 3.8 did), a cluster would be
    started by both workers at once: stop here instead (pyproject pins pytest below 9.2)."""
    if getattr(session.config.option, "loadgroup", False) and any("@" not in item.nodeid for item in session.items):
        raise pytest.UsageError("pytest-xdist did not group the tests (--dist loadgroup): this pytest "
                                "and pytest-xdist do not work together; install pytest<9.2")


def pytest_configure(config):
    global _IN_XDIST_WORKER
    _IN_XDIST_WORKER = hasattr(config, "workerinput")


_IN_XDIST_WORKER = False


def pytest_runtest_logreport(report):
    """GPTRAIN_TEST_TIMES=FILE: each test's phase durations appended as they finish (to see where
    the suite's time goes while it still runs; --durations says it only at the end). Written
    once, by the process that reports (under xdist the workers' reports reach it too)."""
    where = os.environ.get("GPTRAIN_TEST_TIMES")
    if where and report.when in ("setup", "call") and not _IN_XDIST_WORKER:
        with open(where, "a") as f:
            f.write(f"{report.duration:.1f} {report.when} {report.nodeid}\n")
