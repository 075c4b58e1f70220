"""The Kubernetes scheduler's manifests (jobs/engines/kube_manifest.py) as `gptrain run --dry-run` prints
them, checked against the real JobSet CRD schema of jobset v0.12.0 (crds/README.md), and the
submit path's one-line refusals. No API server can run here: what talks to one (jobs/engines/kube.py's
Cluster) is exercised only up to the client's absence or an unusable kubeconfig.

The CRD's openAPIV3Schema is checked with jsonschema; its CEL rules (x-kubernetes-validations)
and the API server's own checks of the embedded pod template are not run here. The Secret has
no schema here: it is checked for the fields Kubernetes requires, and read by the official
client's typed V1Secret model (which refuses wrong types).
"""

import re
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import run_cli

CRDS = Path(__file__).parent / "crds"
DNS_1035 = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")
SECRET = "s3cr3t-value-Zq9"
BASE = ["--scheduler", "kubernetes", "--k8s-volume", "gptrain-home", "--dry-run"]
TRAIN = ["--", "--train.max_steps=3", "--model.n_layer=2"]


def jobset_schema() -> dict:
    crd = yaml.safe_load((CRDS / "jobset.x-k8s.io_jobsets.yaml").read_text())
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1alpha2")
    return version["schema"]["openAPIV3Schema"]


def dry_run(name="demo", *extra, env=None):
    r = run_cli("run", name, *BASE, *extra, *TRAIN, env=env)
    assert r.returncode == 0, r.stderr
    return r.stdout, {d["kind"]: d for d in yaml.safe_load_all(r.stdout)}


def pod_spec(jobset):
    job = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]
    return job, job["template"]["spec"]


def env_of(container):
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_a_2x1_job_validates_against_the_jobset_crd_and_the_secret_is_well_formed():
    import jsonschema

    out, docs = dry_run("demo", "--nodes", "2", "--accels", "1", "--secret", f"WANDB_API_KEY={SECRET}")
    assert list(docs) == ["Secret", "JobSet"]
    jsonschema.Draft7Validator(jobset_schema()).validate(docs["JobSet"])
    secret = docs["Secret"]
    assert (secret["apiVersion"], secret["kind"], secret["type"]) == ("v1", "Secret", "Opaque")
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", secret["metadata"]["name"])
    assert all(isinstance(v, str) for v in secret["stringData"].values())
    V1Secret = pytest.importorskip("kubernetes.client", reason="the kubernetes client is not installed "
                                   "(pip install 'gptrain[kubernetes]')").V1Secret  # a typed model

    model = V1Secret.from_dict(secret)
    assert model.metadata.name == secret["metadata"]["name"] and model.string_data == secret["stringData"]


def test_a_bad_manifest_is_refused_by_the_schema():
    """(the schema check is real: a wrong type and an unknown restart policy fail it)"""
    import jsonschema

    _, docs = dry_run("demo", "--nodes", "2")
    js = docs["JobSet"]
    js["spec"]["failurePolicy"]["maxRestarts"] = "three"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(js, jobset_schema())


def test_secret_values_are_referenced_by_name_never_written(isolated_home):
    out, docs = dry_run("demo", "--secret", f"WANDB_API_KEY={SECRET}", "--k8s-secret", "hf-token")
    assert SECRET not in out
    _, pod = pod_spec(docs["JobSet"])
    c = pod["containers"][0]
    assert c["envFrom"] == [{"secretRef": {"name": "demo-secrets"}}, {"secretRef": {"name": "hf-token"}}]
    assert "WANDB_API_KEY" not in env_of(c)
    assert docs["Secret"]["stringData"] == {"WANDB_API_KEY": "***"}
    assert not any(SECRET in p.read_text(errors="replace") for p in isolated_home.rglob("*") if p.is_file())


def test_kueue_queue_label_only_where_asked():
    _, docs = dry_run("demo", "--queue", "team-a")
    assert docs["JobSet"]["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    _, docs = dry_run("demo")
    assert "kueue.x-k8s.io/queue-name" not in docs["JobSet"]["metadata"]["labels"]


def test_nodes_ranks_and_the_rendezvous_at_the_first_pod():
    _, docs = dry_run("demo", "--nodes", "3", "--accels", "2")
    js = docs["JobSet"]
    job, pod = pod_spec(js)
    assert (job["parallelism"], job["completions"], job["completionMode"]) == (3, 3, "Indexed")
    assert js["spec"]["replicatedJobs"][0]["replicas"] == 1
    c = pod["containers"][0]
    env = env_of(c)
    index = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    assert env["PET_NODE_RANK"] == {"fieldRef": {"fieldPath": index}}  # torchrun's --node-rank
    cmd = c["command"]
    assert cmd[1:3] == ["-m", "torch.distributed.run"]
    assert {"--nproc-per-node=2", "--nnodes=3", "--rdzv-backend=static",
            "--rdzv-endpoint=demo-node-0-0.demo:29500"} <= set(cmd)
    assert "gptrain.jobs.rank_log" in cmd and cmd[-1].startswith("--train.output_dir=")
    assert js["spec"]["network"]["enableDNSHostnames"] is True
    assert c["resources"] == {"limits": {"nvidia.com/gpu": "2"}}


def test_one_node_is_standalone_and_cpu_accels_are_cpu_requests():
    _, docs = dry_run("demo", "--accel-type", "cpu", "--accels", "2")
    c = pod_spec(docs["JobSet"])[1]["containers"][0]
    assert "--standalone" in c["command"] and "PET_NODE_RANK" not in env_of(c)
    assert c["resources"] == {"requests": {"cpu": "2"}} and env_of(c)["OMP_NUM_THREADS"] == "1"


def test_a_command_entrypoint_gets_the_rendezvous_variables():
    r = run_cli("run", "cmd", *BASE, "--nodes", "2", "--", "bash", "-c", "echo $NODE_RANK $(hostname)")
    assert r.returncode == 0, r.stderr
    c = pod_spec(yaml.safe_load(r.stdout))[1]["containers"][0]
    env = env_of(c)
    assert env["MASTER_ADDR"] == "cmd-node-0-0.cmd" and env["NNODES"] == "2" and env["WORLD_SIZE"] == "2"
    assert "fieldRef" in env["NODE_RANK"]
    # the user's words as data; `$` doubled so that Kubernetes does not expand $(hostname)
    assert c["command"][-3:] == ["bash", "-c", "echo $$NODE_RANK $$(hostname)"]


def test_max_restarts_maps_to_the_jobsets_failure_policy():
    _, docs = dry_run("demo", "--max-restarts", "4")
    js = docs["JobSet"]
    job, pod = pod_spec(js)
    assert js["spec"]["failurePolicy"] == {"maxRestarts": 4}
    assert job["backoffLimit"] == 0 and pod["restartPolicy"] == "Never"  # a failed pod restarts the set
    assert {"name": "GPTRAIN_ATTEMPT", "valueFrom": {"fieldRef": {
        "fieldPath": "metadata.labels['jobset.sigs.k8s.io/restart-attempt']"}}} in pod["containers"][0]["env"]


@pytest.mark.parametrize("job", ["demo", "my_job.v2", "7b-run", "a" * 64])
def test_resource_names_are_dns_safe_short_and_distinct(job):
    from gptrain.jobs.engines.kube_manifest import MAX_NAME, resource_name

    rn = resource_name(job)
    assert DNS_1035.fullmatch(rn) and len(rn) <= MAX_NAME
    assert len(f"{rn}-node-0-999-abcde") <= 63  # a pod of a 1000-node job
    sibling = job.replace("_", "-").replace(".", "-")  # another job, named as Kubernetes would
    assert sibling == job or rn != resource_name(sibling)
    _, docs = dry_run(job)
    assert docs["JobSet"]["metadata"]["name"] == rn
    assert docs["JobSet"]["metadata"]["annotations"]["gptrain/job"] == job


def test_volume_image_namespace_and_user_errors():
    _, docs = dry_run("demo", "--image", "reg.example/ml/gptrain:1", "--k8s-namespace", "ml")
    js = docs["JobSet"]
    pod = pod_spec(js)[1]
    assert js["metadata"]["namespace"] == "ml"
    assert pod["containers"][0]["image"] == "reg.example/ml/gptrain:1"
    assert {"name": "gptrain-home", "persistentVolumeClaim": {"claimName": "gptrain-home"}} in pod["volumes"]
    for bad, says in ((["--k8s-volume", "Bad Claim"], "PersistentVolumeClaim"),
                      (["--image", "a b"], "image reference"), (["--queue", "team/a"], "Kueue"),
                      (["--k8s-namespace", "Ns"], "namespace")):
        r = run_cli("run", "demo", *BASE, *bad, *TRAIN)
        assert r.returncode == 2 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = run_cli("run", "demo", "--scheduler", "kubernetes", "--dry-run", *TRAIN)
    assert r.returncode == 2 and "--k8s-volume" in r.stderr


NO_CLIENT = ("import sys; sys.modules['kubernetes'] = None; from gptrain.cli import main; "
             "sys.exit(main(sys.argv[1:]))")  # (None in sys.modules: `import kubernetes` fails)


def without_client(*args):
    import subprocess

    return subprocess.run([sys.executable, "-c", NO_CLIENT, *args], capture_output=True, text=True, timeout=120)


def test_dry_run_needs_no_client_and_a_real_submit_without_it_is_one_line(isolated_home):
    r = without_client("run", "demo", *BASE, *TRAIN)
    assert r.returncode == 0 and "kind: JobSet" in r.stdout, r.stderr
    r = without_client("run", "demo", *BASE[:-1], "--secret", f"K={SECRET}", *TRAIN)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "gptrain: error: the Kubernetes client is not installed here: pip install 'gptrain[kubernetes]' "
        "(or --dry-run to print the manifests without it)"]
    assert not (isolated_home / "jobs" / "demo").exists() and not (isolated_home / "secrets").exists()
    assert "demo" not in run_cli("jobs").stdout


def test_a_submit_without_a_kubeconfig_is_one_line_and_records_nothing(isolated_home, tmp_path):
    env = {"KUBECONFIG": str(tmp_path / "none"), "HOME": str(tmp_path), "KUBERNETES_SERVICE_HOST": ""}
    r = run_cli("run", "demo", *BASE[:-1], *TRAIN, env=env)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "kubeconfig" in r.stderr, r.stderr
    assert not (isolated_home / "jobs" / "demo").exists()


def kubeconfig_to_nowhere(tmp_path) -> dict:
    """A real kubeconfig whose server is a closed port here (no API server can run here)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # (closed again: connections are refused)
    cfg = {"apiVersion": "v1", "kind": "Config", "current-context": "here",
           "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{port}",
                                                  "insecure-skip-tls-verify": True}}],
           "users": [{"name": "u", "user": {"token": "t"}}],
           "contexts": [{"name": "here", "context": {"cluster": "c", "user": "u", "namespace": "ml"}}]}
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(cfg))
    return {"KUBECONFIG": str(path)}


def test_an_unreachable_cluster_is_one_line_and_a_failed_submit_leaves_nothing(isolated_home, tmp_path):
    env = kubeconfig_to_nowhere(tmp_path)
    server = yaml.safe_load(Path(env["KUBECONFIG"]).read_text())["clusters"][0]["cluster"]["server"]
    r = run_cli("run", "demo", *BASE[:-1], "--secret", f"K={SECRET}", *TRAIN, env=env, timeout=120)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"gptrain: error: reading the job's Secret: cannot reach the cluster at {server} (MaxRetryError)"], r.stderr
    assert not (isolated_home / "jobs" / "demo").exists() and not (isolated_home / "secrets" / "demo.env").exists()
    assert "demo" not in run_cli("jobs").stdout


def test_a_recorded_job_reads_as_last_known_while_its_cluster_is_unreachable(isolated_home, tmp_path, monkeypatch):
    from gptrain.jobs import store
    from gptrain.jobs.engines import kube
    from gptrain.jobs.spec import JobSpec

    for k, v in kubeconfig_to_nowhere(tmp_path).items():
        monkeypatch.setenv(k, v)
    spec = JobSpec(name="demo", scheduler="kubernetes", kubernetes={"volume": "home"}, args=TRAIN[1:]).validate()
    kube.prepare(spec, None)
    store.update("demo", external_id="uid-1")  # as a submit records the JobSet's uid
    assert kube.refresh("demo")["state"] == "queued"
    assert kube.describe(store.get_job("demo")).startswith("kubernetes JobSet demo: cannot be read here")
    r = run_cli("inspect", "demo", env={"KUBECONFIG": str(tmp_path / "kubeconfig")}, timeout=120)
    assert r.returncode == 0 and "kubernetes JobSet demo: cannot be read here" in r.stdout, r.stderr
    r = run_cli("stop", "demo", env={"KUBECONFIG": str(tmp_path / "kubeconfig")}, timeout=120)
    assert r.returncode == 2 and "cannot reach the cluster" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert store.get_job("demo")["state"] == "queued" and not (isolated_home / "jobs/demo/stop-request").exists()


def test_the_dry_run_in_docs_kubernetes_md_is_what_the_command_prints(isolated_home, tmp_path):
    from tests.helpers import make_dataset

    doc = (Path(__file__).parents[2] / "docs" / "kubernetes.md").read_text()
    pasted = doc.split("```yaml\n# gptrain job gpt2-small")[1].split("```")[0]
    assert run_cli("data", "push", "shakespeare-char", make_dataset(tmp_path)).returncode == 0
    r = run_cli("run", "gpt2-small", "--scheduler", "kubernetes", "--nodes", "2", "--accels", "1",
                "--k8s-volume", "gptrain-home", "--k8s-namespace", "ml", "--image",
                "registry.example.com/ml/gptrain:0.1.0", "--secret", "WANDB_API_KEY", "--queue", "team-a",
                "--max-restarts", "2", "--dataset", "shakespeare-char", "--dry-run", "--",
                "--model.preset=gpt2", "--train.max_steps=5000", env={"WANDB_API_KEY": SECRET})
    assert r.returncode == 0, r.stderr
    assert r.stdout.replace(str(isolated_home), "/mnt/gptrain") == "# gptrain job gpt2-small" + pasted


def test_the_grace_period_is_sized_from_the_checkpoint_the_model_writes(isolated_home, monkeypatch):
    """terminationGracePeriodSeconds: a minute for the step, then the checkpoint (12 bytes a
    parameter, shared by the nodes) twice at SAVE_BYTES_PER_S; at least 120 s."""
    import math

    from gptrain.jobs.engines import kube_manifest as km

    monkeypatch.setenv("GPTRAIN_ALLOW_LARGE_MODEL", "1")
    small = yaml.safe_load_all(run_cli("run", "small", *BASE, "--", "--model.preset=gpt2").stdout)
    big = run_cli("run", "big", *BASE, "--nodes", "2", "--", "--model.preset=gpt2-xl")
    assert big.returncode == 0, big.stderr
    grace = {name: pod_spec(next(d for d in docs if d["kind"] == "JobSet"))[1]["terminationGracePeriodSeconds"]
             for name, docs in (("small", small), ("big", yaml.safe_load_all(big.stdout)))}
    assert grace["small"] == km.STOP_GRACE_S
    params = 1_556_684_800  # gpt2-xl's param_estimate
    assert grace["big"] == math.ceil(60 + 2 * params * 12 / 2 / km.SAVE_BYTES_PER_S) > km.STOP_GRACE_S
