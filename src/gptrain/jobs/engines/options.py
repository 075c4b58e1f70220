"""What a job may ask of each engine, declared once: each option's key (in the job's `slurm:`,
`kubernetes:` or `ray:` section, its job.yaml and record), its `gptrain run` flag, its help, the
form a value must have, whether `$GPTRAIN_HOME/config.toml` gives its default, and where it goes
(Slurm: an `#SBATCH` line). Read by the engines' checks (slurm.py, kube_manifest.py,
ray_cluster.py), the submission's defaults (jobs/submission.py), `gptrain run`'s flags (cli/run.py)
and the console's launch form (jobs/api.FACTS). Data only: nothing here imports an engine."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Option:
    key: str  # in the job's engine section
    flag: str | None  # `gptrain run`'s flag; None: a job file's or config.toml's only
    help: str = ""
    form: re.Pattern | None = None  # what a text value must match (fullmatch) ...
    words: str = ""  # ... said in words
    kind: str = "text"  # text | int | list (repeatable flag) | choice
    choices: tuple = ()
    user_default: bool = False  # taken from config.toml's [ENGINE] KEY when the job does not say
    sbatch: bool = False  # Slurm: written into the script as `#SBATCH --KEY=VALUE`
    metavar: str | None = None  # its value, as the flag's help shows it

    @property
    def dest(self) -> str:
        """The argparse destination of its flag."""
        return (self.flag or self.key).lstrip("-").replace("-", "_")


_NAME = r"[A-Za-z0-9_.-]+"
_WORD = re.compile(r"[^\s\x00-\x1f]+")  # one word: an image reference, a path, a context name
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
DNS_SUBDOMAIN = re.compile(r"(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_LABEL_VALUE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")

# every engine that starts processes itself: the rendezvous port and what --accels counts
PORT = Option("port", "--port", "rendezvous port on the first node (29500)", kind="int")
ACCEL_TYPE = Option("accel_type", "--accel-type", "--accels as GPUs (--gres=gpu:M) or CPUs per node; auto "
                    "asks the cluster", kind="choice", choices=("auto", "gpu", "cpu"))

SLURM = (
    Option("partition", "--partition", "Slurm partition(s), comma-separated",
           re.compile(rf"{_NAME}(,{_NAME})*"), "partition names (letters, digits, _ - .), comma-separated",
           user_default=True, sbatch=True),
    Option("account", "--account", "Slurm account to charge", re.compile(_NAME),
           "an account name (letters, digits, _ - .)", user_default=True, sbatch=True),
    Option("time", "--time", "time limit, e.g. 04:00:00",
           re.compile(r"\d+(:\d+){0,2}|\d+-\d+(:\d+){0,2}|UNLIMITED|INFINITE", re.I),
           "a Slurm time: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S or UNLIMITED (quoted in YAML)",
           user_default=True, sbatch=True),
    Option("sbatch_args", "--sbatch-arg", "extra sbatch option, e.g. --sbatch-arg=--exclusive (repeatable)",
           kind="list", metavar="ARG"),
    PORT, ACCEL_TYPE,
)
KUBERNETES = (
    Option("image", "--image", "container image with gptrain (default gptrain:0.1.0)", _WORD,
           "an image reference (registry/name:tag)", user_default=True),
    Option("volume", "--k8s-volume", "PersistentVolumeClaim holding $GPTRAIN_HOME, mounted there in every pod",
           DNS_SUBDOMAIN, "a PersistentVolumeClaim name (lowercase letters, digits, - .)", user_default=True, metavar="CLAIM"),
    Option("namespace", "--k8s-namespace", "namespace of the job's resources", _DNS_LABEL,
           "a namespace name (lowercase letters, digits, -)", user_default=True, metavar="NS"),
    Option("context", "--k8s-context", "kubeconfig context (default: the current one)", _WORD,
           "a kubeconfig context name", user_default=True, metavar="CONTEXT"),
    Option("secrets", "--k8s-secret", "a Secret in the namespace whose keys every pod gets as variables "
           "(repeatable)", kind="list", user_default=True, metavar="NAME"),
    Option("queue", "--queue", "Kueue LocalQueue (label kueue.x-k8s.io/queue-name)", _LABEL_VALUE,
           "a Kueue LocalQueue name (letters, digits, - _ ., at most 63)", user_default=True),
    Option("python", None, "the image's Python (a path or a command name)", _WORD,
           "the image's Python (a path or a command name)", user_default=True),
    PORT, ACCEL_TYPE,
)
RAY = (
    Option("address", None, "the Ray cluster's address (default: RAY_ADDRESS, else [ray] address)",
           re.compile(r"(ray://)?[A-Za-z0-9_.:\[\]-]+:\d+|auto"), "a Ray address, HOST:PORT"),
)
OPTIONS = {"slurm": SLURM, "kubernetes": KUBERNETES, "ray": RAY}


def keys(engine: str) -> tuple[str, ...]:
    return tuple(o.key for o in OPTIONS[engine])


def forms(engine: str) -> dict:
    """key -> (compiled form, what it must be in words), for jobs/spec.check_scheduler_options."""
    return {o.key: (o.form, o.words) for o in OPTIONS[engine] if o.form is not None}


def flag_of(engine: str, key: str) -> str:
    """How a user gives option `key`: its flag, else its job-file key."""
    option = next((o for o in OPTIONS[engine] if o.key == key), None)
    return option.flag if option is not None and option.flag else f"{engine}: {key}:"


def shown() -> dict:
    """What the console's launch form offers of each engine (facts served to the page)."""
    return {engine: [{"key": o.key, "flag": o.flag, "help": o.help, "kind": o.kind, "choices": list(o.choices)}
                     for o in engine_options if o.flag]
            for engine, engine_options in OPTIONS.items()}
