"""The pods a Kubernetes job's JobSet makes, run for real under `podman kube play`: gptrain's
built-in trainer on a tiny dataset for a few steps, from the job folder that submit prepares
(jobs/kube.prepare: the record, logs/, checkpoints/, kubernetes.yaml), to a checkpoint and rank
logs that gptrain then reads like any job's. One node; and 2 x 1: two pods, each a host of its
own (its own network namespace, address and hostname) on a bridge network the test makes (a
random /24, fixed addresses; removed by name), whose torchrun agents meet at the static
rendezvous the manifest names, NAME-node-0-0.NAME:29500, and train one model over gloo.

No API server or JobSet controller can run here, so the test stands in for them, and for an
image registry and the cluster's DNS, in the smallest ways that work on this machine (Debian
12, root, podman 4.3):

- The Pods are the JobSet's pod template, unchanged, with what the JobSet and Job controllers
  add to each pod: its name (NAME-node-0-I; a cluster adds a random suffix), the restart-attempt
  label and completion-index annotation its downward-API variables read, the hostname the
  Indexed Job gives (NAME-node-0-I) and the subdomain JobSet gives (NAME, its headless service).
  The container's `ports` are dropped: on a cluster they are informational, podman 4.3
  publishes them on this machine (two pods would both take port 29500 here).
- The cluster's DNS: the headless service makes NAME-node-0-I.NAME (and its full name in the
  namespace) resolve to pod I's address; here each pod gets `hostAliases` saying the same (in
  its /etc/hosts, where podman, like the kubelet, also maps the pod's own hostname to its address).
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
import uuid
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


def prepare_job(tmp_path, name: str, nodes: int):
    """A kubernetes job NAME of NODES x 1, prepared as submit does (jobs/kube.prepare) before its
    API call: its folder, the claim's name, and the JobSet's pod template as written there."""
    from gptrain.jobs import folder
    from gptrain.jobs.engines import kube, kube_manifest
    from gptrain.jobs.spec import JobSpec

    assert run_cli("data", "push", "tiny", make_dataset(tmp_path)).returncode == 0
    claim = f"gptrain-test-{tmp_path.name.lower().replace('_', '-')}"[:60]
    spec = JobSpec(name=name, scheduler="kubernetes", datasets=["tiny"], nodes=nodes, accels=1,
                   env={"PYTHONPATH": str(ROOT / "src")},
                   kubernetes={"volume": claim, "accel_type": "cpu", "python": sys.executable, "image": IMAGE},
                   args=[*TINY, "--train.max_steps=3", "--train.batch_size=4", "--checkpoint.every=3"]).validate()
    kube_manifest.check_options(spec)
    jdir = kube.prepare(spec, None)  # what submit records and writes before the API call
    docs = {d["kind"]: d for d in yaml.safe_load_all(folder.kube_manifests(jdir).read_text())}
    replicated = docs["JobSet"]["spec"]["replicatedJobs"][0]
    assert replicated["template"]["spec"]["completions"] == nodes
    return jdir, claim, replicated["template"]["spec"]["template"]


def node_pods(job: str, template: dict, nodes: int, ips: list[str] | None = None) -> list[dict]:
    """The NODES pods the JobSet and Job controllers make of the template, one per completion
    index I: named NAME-node-0-I (on a cluster with a random suffix), the restart-attempt label
    and the completion-index annotation, the hostname the Indexed Job gives (its Job NAME-node-0, dash,
    index) and the subdomain JobSet gives (its headless service, NAME). With `ips`, hostAliases
    stand in for the cluster's DNS: every pod's NAME-node-0-I.NAME (and its full name in the
    namespace) resolves to that pod's address."""
    from gptrain.jobs.engines import kube_manifest

    rn = kube_manifest.resource_name(job)
    hosts = [f"{rn}-{kube_manifest.NODE_JOB}-0-{i}" for i in range(nodes)]
    pods = []
    for i, host in enumerate(hosts):
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": host,
                            "labels": {**template["metadata"]["labels"], "jobset.sigs.k8s.io/restart-attempt": "0"},
                            "annotations": {**template["metadata"]["annotations"],
                                            "batch.kubernetes.io/job-completion-index": str(i)}},
               "spec": {**copy.deepcopy(template["spec"]), "hostname": host, "subdomain": rn}}
        if ips:
            pod["spec"]["hostAliases"] = [{"ip": ip, "hostnames": [f"{h}.{rn}", f"{h}.{rn}.default.svc.cluster.local"]}
                                          for h, ip in zip(hosts, ips)]
        pod["spec"]["containers"][0].pop("ports", None)  # podman 4.3 publishes them on this machine
        host_mounts(pod)
        pods.append(pod)
    return pods


def play(podman, tmp_path, home, claim: str, pods: list[dict], network: str | None = None,
         ips: list[str] | None = None) -> dict:
    """Each pod under `podman kube play` (on `network` at its address in `ips`, if given), on the
    claim (a podman volume bound to `home`); waits for every node container to exit. Returns
    {pod: (exit code, its agent's output, its /etc/hosts)}; removes the pods and the volume."""
    files = []
    podman("volume", "create", "--opt", "type=none", "--opt", "o=bind", "--opt", f"device={home}", claim)
    try:
        for i, pod in enumerate(pods):
            files.append(tmp_path / f"{pod['metadata']['name']}.yaml")
            files[-1].write_text(yaml.safe_dump(pod, sort_keys=False))
            net = ["--network", network, "--ip", ips[i]] if network else []
            podman("kube", "play", *net, str(files[-1]))
        out = {}
        for pod in pods:
            c = f"{pod['metadata']['name']}-node"
            code = podman("wait", c, timeout=300).stdout.strip()
            logs = podman("logs", c, check=False)
            hosts_path = podman("inspect", c, "--format", "{{.HostsPath}}", check=False).stdout.strip()
            etc_hosts = Path(hosts_path).read_text() if hosts_path and Path(hosts_path).is_file() else ""
            out[pod["metadata"]["name"]] = (code, logs.stdout[-2000:] + logs.stderr[-2000:], etc_hosts)
        return out
    finally:
        for f in files:
            podman("kube", "down", str(f), check=False)
        podman("volume", "rm", "-f", claim, check=False)


def ran(out: dict, logs: Path) -> None:
    """Every pod's node container exited 0, else its output and the rank logs say why."""
    for name, (code, agent, _) in out.items():
        tails = "".join(f"\n{p.name}:\n{p.read_text()[-2000:]}" for p in sorted(logs.glob("rank-*.log")))
        assert code == "0", f"{name}: exit {code}\n{agent}{tails or '(no rank log)'}"


def checkpoint_listed(job: str) -> None:
    from gptrain.jobs import found, store
    from gptrain.weights.layout import step_name

    assert [c["step"] for c in found.scan_job(job)] == [3]
    store.sync_checkpoints(job, found.scan_job(job))
    r = run_cli("checkpoints", job)
    assert r.returncode == 0 and step_name(3) in r.stdout, r.stdout + r.stderr


def test_the_jobsets_pod_trains_under_podman_kube_play(podman, tmp_path, isolated_home):
    from gptrain.jobs import folder
    from gptrain.jobs.logs import rank_log

    jdir, claim, template = prepare_job(tmp_path, "pod1", nodes=1)
    ran(play(podman, tmp_path, isolated_home, claim, node_pods("pod1", template, 1)), folder.logs_dir(jdir))
    text = rank_log(folder.logs_dir(jdir), 0).read_text()
    assert "--- gptrain: attempt 0, rank 0" in text and "step 3" in text.lower(), text[-2000:]
    checkpoint_listed("pod1")


def test_two_pods_meet_over_the_network_and_train(podman, tmp_path, isolated_home):
    """2 x 1: the two pods, each a host of its own on a bridge network, meet at the rendezvous
    address the manifest names (NAME-node-0-0.NAME:29500) and train one model together."""
    from gptrain.jobs import folder
    from gptrain.jobs.engines import kube_manifest
    from gptrain.jobs.logs import rank_log
    from tests.hosts.podman_hosts import bridge_network

    jdir, claim, template = prepare_job(tmp_path, "pod2", nodes=2)
    head = kube_manifest.head_host("pod2")
    node = template["spec"]["containers"][0]
    assert f"--rdzv-endpoint={head}:{kube_manifest.DEFAULT_PORT}" in node["command"]
    assert node["ports"] == [{"name": "rendezvous", "containerPort": kube_manifest.DEFAULT_PORT}]
    net = f"gptrain-k8s-{uuid.uuid4().hex[:8]}"
    try:
        base = bridge_network(net)
        ips = [f"{base}.11", f"{base}.12"]
        pods = node_pods("pod2", template, 2, ips)
        # rank 1 first: on a cluster the pods start in any order, and its agent waits for the head
        out = play(podman, tmp_path, isolated_home, claim, pods[::-1], network=net, ips=ips[::-1])
    finally:
        podman("network", "rm", "-f", net, check=False)
    ran(out, folder.logs_dir(jdir))
    for rank, (pod, ip) in enumerate(zip(pods, ips)):
        host = pod["spec"]["hostname"]
        etc_hosts = out[host][2]  # what the pod resolved: its head's DNS name to the head pod's address
        assert any(line.split()[:1] == [ips[0]] and head in line.split() for line in etc_hosts.splitlines()), etc_hosts
        assert any(line.split()[:1] == [ip] and host in line.split() for line in etc_hosts.splitlines()), etc_hosts
        text = rank_log(folder.logs_dir(jdir), rank).read_text()
        assert f"--- gptrain: attempt 0, rank {rank}," in text and f", host {host}, world 2" in text, text[-2000:]
    assert "step 3" in rank_log(folder.logs_dir(jdir), 0).read_text().lower()
    checkpoint_listed("pod2")
