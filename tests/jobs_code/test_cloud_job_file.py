"""The cloud job service's own YAML (the seed's `ads opctl run -f pytorch_mingpt_fsdp.yaml`, with
its `runtime` replaced as the tutorial says) run by `gptrain run -f` as its users wrote it: a git
runtime cloned, main + worker replicas as nodes, the cluster's env given, and every field that has
no meaning here named in one note (jobs/programs/cloud_job.py)."""

import json
import time

import pytest

from gptrain.errors import UserError
from gptrain.jobs.programs import cloud_job
from tests.conftest import run_cli
from tests.jobs_code.programs import git_repository, write

SEED_YAML = """
kind: distributed
apiVersion: v1.0
spec:
  infrastructure:
    kind: infrastructure
    type: dataScienceJob
    apiVersion: v1.0
    spec:
      projectId: ocid1.datascienceproject.oc1.iad.<unique_ID>
      compartmentId: ocid1.compartment.oc1..<unique_ID>
      logGroupId: ocid1.loggroup.oc1.iad.<unique_ID>
      logId: ocid1.log.oc1.iad.<unique_ID>
      subnetId: ocid1.subnet.oc1.iad.<unique_ID>
      shapeName: {shape}
      blockStorageSize: 256
  cluster:
    kind: pytorch
    apiVersion: v1.0
    spec:
      image: "iad.ocir.io/<namespace>/mingpt:latest"
      workDir: "oci://bucket@namespace/prefix"
      name: "MinGPT"
      config:
        env:
          - name: NCCL_ASYNC_ERROR_HANDLING
            value: '1'
      main:
        name: PyTorchDistributed-main
        replicas: 1
      worker:
        name: PyTorchDistributed-worker
        replicas: 1
  runtime:
    apiVersion: v1.0
    kind: python
    type: "git"
    spec:
      uri: "{uri}"
      branch: "main"
      entryPoint: "distributed/minGPT-ddp/mingpt/main.py"
      codeDir: "/home/datascience/pytorch"
      args:
        - data_config.path=input.txt
        - trainer_config.max_epochs=1
"""

MAIN_PY = """
import os, sys, torch.distributed as dist
dist.init_process_group("gloo")
print("rank", dist.get_rank(), "of", dist.get_world_size(), "node", os.environ["GROUP_RANK"],
      "nccl", os.environ["NCCL_ASYNC_ERROR_HANDLING"], "args", " ".join(sys.argv[1:]), flush=True)
dist.destroy_process_group()
"""


def test_the_seed_yaml_translates(tmp_path):
    data = __import__("yaml").safe_load(SEED_YAML.replace("{shape}", "VM.GPU.A10.2").replace("{uri}", "https://github.com/pytorch/examples.git"))
    fields, notes = cloud_job.translate(data, "job.yaml")
    assert fields == {"name": "mingpt", "accels": 2, "nodes": 2, "env": {"NCCL_ASYNC_ERROR_HANDLING": "1"},
                      "repository_url": "https://github.com/pytorch/examples.git", "ref": "main",
                      "script": "distributed/minGPT-ddp/mingpt/main.py",
                      "args": ["data_config.path=input.txt", "trainer_config.max_epochs=1"]}
    said = " | ".join(notes)
    for word in ("spec.infrastructure", "spec.cluster.spec.image", "spec.cluster.spec.workDir",
                 "spec.runtime.spec.codeDir"):
        assert word in said, said
    assert (cloud_job.gpus_of("BM.GPU4.8"), cloud_job.gpus_of("VM.Standard2.1")) == (8, None)


@pytest.mark.parametrize("change, message", [
    (lambda d: d["spec"]["runtime"].update(type="container"), "is not one gptrain runs"),
    (lambda d: d["spec"]["runtime"]["spec"].pop("entryPoint"), "name the program to run"),
    (lambda d: d["spec"]["cluster"]["spec"]["worker"].update(replicas="two"), "whole number"),
    (lambda d: d["spec"]["cluster"]["spec"]["config"].update(env={"A": 1}), "list of {name"),
])
def test_a_malformed_cloud_job_file_is_one_line(change, message):
    data = __import__("yaml").safe_load(SEED_YAML.replace("{shape}", "VM.Standard2.1").replace("{uri}", "file:///x"))
    change(data)
    with pytest.raises(UserError, match=message):
        cloud_job.translate(data, "job.yaml")


def test_the_seed_yaml_runs_as_typed(tmp_path, isolated_home, monkeypatch):
    """`gptrain run -f job.yaml` of the seed's file, its runtime a git repository here: 2 nodes
    (main + worker) of 1 process each meet, and the notes name what was left out."""
    monkeypatch.setenv("GPTRAIN_LOCAL_SLOTS", "2")
    repo = git_repository(write(tmp_path / "examples", {"distributed/minGPT-ddp/mingpt/main.py": MAIN_PY}))
    job = tmp_path / "pytorch_mingpt_fsdp.yaml"
    job.write_text(SEED_YAML.replace("{shape}", "VM.Standard2.1").replace("{uri}", f"file://{repo}"))
    r = run_cli("run", "-f", job)
    assert r.returncode == 0, r.stderr
    assert "note:" in r.stderr and "spec.infrastructure ignored" in r.stderr, r.stderr
    deadline = time.time() + 240
    while (state := json.loads(run_cli("inspect", "mingpt", "--json").stdout)["job"]["state"]) not in (
            "succeeded", "failed") and time.time() < deadline:
        time.sleep(0.5)
    log = run_cli("logs", "mingpt").stdout + run_cli("logs", "mingpt", "--rank", "1").stdout
    report = json.loads(run_cli("inspect", "mingpt", "--json").stdout)
    assert state == "succeeded", (log, report["job"].get("error"), report["events"])
    assert "rank 0 of 2 node 0 nccl 1 args data_config.path=input.txt trainer_config.max_epochs=1" in log, log
    assert "rank 1 of 2 node 1" in log, log
    r = run_cli("run", "-f", job)  # the same name again: refused, nothing new
    assert r.returncode == 2 and "already exists" in r.stderr, r.stderr
