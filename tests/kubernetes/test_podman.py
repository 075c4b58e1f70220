"""The pod a Kubernetes job's JobSet makes, run for real under `podman kube play`: one node,
gptrain's built-in trainer on a tiny dataset for a few steps, from the job folder that submit
prepares (jobs/kube.prepare: the record, logs/, checkpoints/, kubernetes.yaml), to a checkpoint
and a rank log that gptrain then reads like any job's.

No API server or JobSet controller can run here, so the test stands in for them, and for an
image registry, in the smallest ways that work on this machine (Debian 12, root, podman 4.3):

- The Pod is the JobSet's pod template, unchanged, with what the JobSet and Job controllers add
  to each pod: its name (NAME-node-0-0) and the restart-attempt label and completion-index
  annotation its downward-API variables read.
- The image: gptrain's image would hold Python, torch and gptrain. None can be pulled here, so a
  tiny image is made with `podman import` from a tarball of empty directories (with Debian's
  /bin, /lib, /lib64, /sbin links into /usr) and the host's /usr, this Python's installation,
  its virtualenv and this checkout's src/ are mounted read-only into the pod at the same paths
  (hostPath volumes added to the pod). The job names that image (`--image`), this Python
  (`[kubernetes] python`) and this checkout (`--env PYTHONPATH`), as a user would their own.
- The PersistentVolumeClaim: podman maps a claim to the podman volume of that name, so the test
  creates one bound to the test's $GPTRAIN_HOME (`--opt type=none --opt o=bind`).
- The runtime: crun refuses this machine's cgroups and root lacks CAP_SYS_RESOURCE, so podman
  is given a containers.conf (CONTAINERS_CONF) with runtime = "runc" and default ulimits
  nofile=1024:1024, nproc=4096:4096.

Install: apt-get install -y podman runc catatonit (as root; `make test` does it).
"""

import copy
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, run_cli
from tests.helpers import TINY, make_dataset

pytestmark = pytest.mark.slow

IMAGE = "localhost/gptrain-hostroot:test"
CONTAINERS_CONF = """[containers]
default_ulimits = ["nofile=1024:1024", "nproc=4096:4096"]
[engine]
runtime = "runc"
"""


@pytest.fixture
def podman(tmp_path, monkeypatch):
    if shutil.which("podman") is None or shutil.which("runc") is None:
        pytest.skip("podman and runc are not installed (apt-get install podman runc catatonit)")
    conf = tmp_path / "containers.conf"
    conf.write_text(CONTAINERS_CONF)
    monkeypatch.setenv("CONTAINERS_CONF", str(conf))

    def run(*args, check=True, timeout=180):
        r = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError(f"podman {' '.join(args)}: {r.stderr.strip()[-2000:]}")
        return r

    if run("image", "exists", IMAGE, check=False).returncode != 0:
        tar = tmp_path / "root.tar"
        with tarfile.open(tar, "w") as t:
            for d in ("etc", "tmp", "proc", "sys", "dev", "root", "run", "var/tmp", "work"):
                info = tarfile.TarInfo(d)
                info.type, info.mode = tarfile.DIRTYPE, 0o1777 if "tmp" in d else 0o755
                t.addfile(info)
            for link in ("bin", "lib", "lib64", "sbin"):
                info = tarfile.TarInfo(link)
                info.type, info.linkname = tarfile.SYMTYPE, f"usr/{link}"
                t.addfile(info)
        run("import", str(tar), IMAGE)
    return run


def host_mounts(pod: dict) -> None:
    """The stand-in for the image's contents: the host's /usr, Python and checkout, read-only."""
    paths = sorted({"/usr", sys.base_prefix, sys.prefix, str(ROOT / "src")})
    paths = [p for p in paths if not any(p != q and p.startswith(q + "/") for q in paths)]
    c = pod["spec"]["containers"][0]
    for i, p in enumerate(paths):
        pod["spec"]["volumes"].append({"name": f"host-{i}", "hostPath": {"path": p, "type": "Directory"}})
        c["volumeMounts"].append({"name": f"host-{i}", "mountPath": p, "readOnly": True})


def test_the_jobsets_pod_trains_under_podman_kube_play(podman, tmp_path, isolated_home):
    from gptrain.jobs import folder, found, kube, kube_manifest, store
    from gptrain.jobs.spec import JobSpec

    assert run_cli("data", "push", "tiny", make_dataset(tmp_path)).returncode == 0
    claim = f"gptrain-test-{tmp_path.name.lower().replace('_', '-')}"[:60]
    spec = JobSpec(name="pod1", scheduler="kubernetes", datasets=["tiny"], accels=1,
                   env={"PYTHONPATH": str(ROOT / "src")},
                   kubernetes={"volume": claim, "accel_type": "cpu", "python": sys.executable, "image": IMAGE},
                   args=[*TINY, "--train.max_steps=3", "--train.batch_size=4", "--checkpoint.every=3"]).validate()
    kube_manifest.check_options(spec)
    jdir = kube.prepare(spec, None)  # what submit records and writes before the API call
    docs = {d["kind"]: d for d in yaml.safe_load_all(folder.kube_manifests(jdir).read_text())}
    template = docs["JobSet"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    name = f"{kube_manifest.resource_name('pod1')}-node-0-0"
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name,
                        "labels": {**template["metadata"]["labels"], "jobset.sigs.k8s.io/restart-attempt": "0"},
                        "annotations": {**template["metadata"]["annotations"],
                                        "batch.kubernetes.io/job-completion-index": "0"}},
           "spec": copy.deepcopy(template["spec"])}
    host_mounts(pod)
    play = tmp_path / "pod.yaml"
    play.write_text(yaml.safe_dump(pod, sort_keys=False))
    podman("volume", "create", "--opt", "type=none", "--opt", "o=bind", "--opt", f"device={isolated_home}", claim)
    try:
        podman("kube", "play", str(play))
        code = podman("wait", f"{name}-node", timeout=300).stdout.strip()
        agent = podman("logs", f"{name}-node", check=False)
        rank0 = (folder.logs_dir(jdir) / "rank-0.log")
        assert code == "0", f"exit {code}\n{agent.stdout[-2000:]}{agent.stderr[-2000:]}\n" + (
            rank0.read_text()[-3000:] if rank0.is_file() else "(no rank-0.log)")
    finally:
        podman("kube", "down", str(play), check=False)
        podman("volume", "rm", "-f", claim, check=False)
    text = rank0.read_text()
    assert "--- gptrain: attempt 0, rank 0" in text and "step 3" in text.lower(), text[-2000:]
    assert [c["step"] for c in found.scan_job("pod1")] == [3]
    store.sync_checkpoints("pod1", found.scan_job("pod1"))
    r = run_cli("checkpoints", "pod1")
    assert r.returncode == 0 and "step-000003" in r.stdout, r.stdout + r.stderr
