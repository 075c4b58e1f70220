"""What a job is: resources, datasets, environment, and either the built-in trainer (config +
flags) or a user script (+ args). Built from `gptrain run` flags or a job.yaml, validated before
anything is recorded.

    # job.yaml
    name: shakespeare
    nodes: 1
    accels: 2
    datasets: [shakespeare-char]
    env: {OMP_NUM_THREADS: "1"}        # recorded in plain text (job.json, the database)
    secrets: {WANDB_API_KEY: "..."}    # kept apart, mode 0600, masked everywhere (jobs/secrets.py)
    max_restarts: 2
    config: configs/demo.toml          # or an inline table: {train: {max_steps: 100}}
    args: ["--train.max_steps=100"]    # trainer flags, or the entrypoint's args
    # script: my_train.py              # or module: pkg.train, or command: bash (args: [run.sh])
    # code: .                          # snapshot this directory (jobs/programs/code.py), or:
    # repository_url: https://...      # clone (ref: main) -- or source: NAME (gptrain source add)
    # requirements: requirements.txt   # extra packages, in a virtualenv layered on gptrain's
    #                                  # (with repository_url/source: a path inside the repository)
    # resume_args: hf                  # appended on a restart with a checkpoint (jobs/resume.py):
    #                                  # hf, nanogpt, or '--resume_from_checkpoint {checkpoint}'
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path

from gptrain.config_check import PATH_KEYS
from gptrain.errors import UserError, closest
from gptrain.home import check_name
from gptrain.jobs.engines.table import ENGINES, engine
from gptrain.jobs.launch import ENTRY_KINDS
from gptrain.locations import is_url


ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
NODES = re.compile(r"\s*(\d+)\s*(?::\s*(\d+)\s*)?")  # N or MIN:MAX
MAX_RESTARTS = 10_000  # a crash loop of a minute a try: a week
MOST = {"nodes": 8192, "accels": 1024}  # bounds any count a user gives (a typo's 1000000000 is one line)
MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


@dataclass
class JobSpec:
    name: str
    nodes: int = 1                     # the most nodes (`--nodes N`, or MAX of `--nodes MIN:MAX`)
    accels: int = 1
    datasets: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    secrets: dict[str, str] = field(default_factory=dict)  # values only until submitted (see to_dict)
    max_restarts: int = 0
    scheduler: str = "local"
    config: str | None = None          # TOML text of the trainer config (from a file or inline)
    config_path: str | None = None     # where that text came from, for error messages
    args: list[str] = field(default_factory=list)
    script: str | None = None          # the user's script: relative to the code snapshot, or absolute
    slurm: dict = field(default_factory=dict)
    kubernetes: dict = field(default_factory=dict)  # jobs/engines/kube_manifest.py OPTIONS
    ray: dict = field(default_factory=dict)  # the cluster found at submit (address, accel_type)
    entry: str | None = None           # trainer | script | module | command (jobs/launch.py)
    module: str | None = None          # `-m module`
    command: str | None = None         # any other program, run once per node
    code: str | None = None            # the directory snapshotted into jobs/NAME/code
    repository_url: str | None = None  # or the git repository cloned into it ...
    ref: str | None = None             # ... at this branch, tag or commit
    commit: str | None = None          # the commit that was cloned (recorded at submit)
    source: str | None = None          # a named repository (`gptrain source add`)
    requirements: str | None = None    # the --requirements file's text
    requirements_file: str | None = None  # with a repository: that file's path in it (read from the clone)
    python: str | None = None          # the job's virtualenv interpreter (from requirements)
    resume_args: str | None = None     # the program's own resume arguments (jobs/resume.py)
    min_nodes: int | None = None       # elastic (`--nodes MIN:MAX`): the fewest it goes on with
    keep_on_failure: float | None = None  # seconds a failed job's environment is kept idle (engines/held.py)

    @property
    def argv(self) -> list[str]:
        """The entrypoint and its arguments, as typed after `--`."""
        head = {"script": [self.script], "module": ["-m", self.module], "command": [self.command]}
        return [*head.get(self.entry or "trainer", []), *self.args]

    def to_dict(self) -> dict:
        """The job as recorded (database, job.json, inspect): secret values masked."""
        from gptrain.jobs.secrets import MASK

        return {**dataclasses.asdict(self), "secrets": {k: MASK for k in self.secrets}}

    @classmethod
    def from_dict(cls, d: dict) -> "JobSpec":
        spec = cls(**d)
        spec.entry = spec.entry or spec.kind()  # recorded before entry kinds existed
        return spec

    def kind(self) -> str:
        return "script" if self.script else "module" if self.module else \
            "command" if self.command else "trainer"

    def validate(self) -> "JobSpec":
        check_types(dataclasses.asdict(self))
        check_name(self.name, "job")
        self.parse_nodes()
        for key, least in (("nodes", 1), ("accels", 1), ("max_restarts", 0)):
            if getattr(self, key) < least:
                raise UserError(f"--{key.replace('_', '-')} must be a whole number >= {least}, "
                                f"got {getattr(self, key)!r}")
        if self.max_restarts > MAX_RESTARTS:
            raise UserError(f"--max-restarts {self.max_restarts} is more than a job is ever restarted "
                            f"({MAX_RESTARTS} at most)")
        for key, most in MOST.items():  # no cluster has more; the engines check what theirs has
            if getattr(self, key) > most:
                raise UserError(f"--{key.replace('_', '-')} {getattr(self, key)} is more than any cluster gptrain "
                                f"runs on ({most} at most): ask for what the machine or cluster has")
        engine(self.scheduler)  # (an unknown one is one line)
        if self.keep_on_failure is not None:
            import shutil

            if self.scheduler != "local" or not 0 < self.keep_on_failure <= 7 * 86400:
                raise UserError("--keep-on-failure keeps a failed job's environment for at most a week, on the local "
                                f"engine for now (got {self.keep_on_failure:g} s on {self.scheduler}): docs/sessions.md")
            if shutil.which("bwrap") is None:
                raise UserError("--keep-on-failure needs bubblewrap for the kept environment: apt-get install bubblewrap")
        check_env(self.env, "env")
        check_env(self.secrets, "secret")
        ours = sorted(k for k in self.secrets if k.startswith("GPTRAIN_"))
        if ours:  # `$GPTRAIN_*` in arguments is expanded into the command line (jobs/launch.py)
            raise UserError(f"secret {ours[0]}: GPTRAIN_* names are gptrain's own (and expanded in "
                            "arguments, where a secret would show); give it another name")
        both = sorted(set(self.env) & set(self.secrets))
        if both:
            raise UserError(f"{both[0]} is given both as an env and as a secret; keep only the secret")
        from gptrain.jobs.secrets import check as check_secrets

        check_secrets(self.secrets)  # too short to mask: refused, the value never shown
        from gptrain.data.store import location_of

        for ds in self.datasets:
            location_of(ds)  # refuses unknown datasets, and ones in object storage not available
        self.entry = self.entry or self.kind()
        if self.entry not in ENTRY_KINDS:
            raise UserError(f"unknown entrypoint kind {self.entry!r}: use {', '.join(ENTRY_KINDS)}")
        if self.module is not None and not MODULE.fullmatch(self.module):
            raise UserError(f"-m {self.module!r} is not a Python module name (e.g. pkg.train)")
        if self.entry == "script" and not (self.code or self.repository_url or self.source):
            p = Path(self.script)
            if not p.is_file():
                raise UserError(f"script {self.script} does not exist")
            self.script = str(p.resolve())
        elif self.entry == "trainer":
            self.resolve_trainer_config()
        if self.resume_args is not None:
            from gptrain.jobs import resume

            if self.entry == "trainer":
                raise UserError("--resume-args is for your own program: the built-in trainer resumes "
                                "from the job's latest checkpoint by itself")
            resume.check(self.resume_args)
        return self

    @property
    def elastic(self) -> bool:
        return self.min_nodes is not None and self.min_nodes < self.nodes

    def parse_nodes(self) -> None:
        """`nodes` as typed: N, or MIN:MAX (elastic: torchrun's --nnodes=MIN:MAX, which goes on
        with the nodes left, down to MIN, when one is lost). Only where torchrun's c10d
        rendezvous runs the nodes: the local and Ray engines, a Python entrypoint."""
        if isinstance(self.nodes, str):
            m = NODES.fullmatch(self.nodes)
            if not m:
                raise UserError(f"--nodes must be N or MIN:MAX (whole numbers), got {self.nodes!r}")
            lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
            if m.group(2) and not 1 <= lo <= hi:
                raise UserError(f"--nodes {self.nodes}: MIN:MAX needs 1 <= MIN <= MAX")
            self.nodes, self.min_nodes = hi, (lo if m.group(2) else None)
        if self.min_nodes is None:
            return
        if not 1 <= self.min_nodes <= self.nodes:
            raise UserError(f"min_nodes {self.min_nodes} must be between 1 and nodes ({self.nodes})")
        if not engine(self.scheduler).elastic:
            elastic = " and ".join(name for name, e in ENGINES.items() if e.elastic)
            raise UserError(f"--nodes {self.min_nodes}:{self.nodes} (elastic) runs on the {elastic} "
                            f"schedulers; {self.scheduler} gives a job a fixed set of nodes: use --nodes N")
        if (self.entry or self.kind()) == "command":
            raise UserError(f"--nodes {self.min_nodes}:{self.nodes} (elastic) needs a Python entrypoint "
                            "run under torchrun (the trainer, a script, -m module), not a command")

    def resolve_trainer_config(self) -> None:
        """Parse the trainer config now, so a bad flag or value is refused before anything is
        recorded, and resolve its paths: every relative path among the flags and in the config
        file is made absolute against the directory the job is submitted from, so the workers
        (which start in the job's folder, on every scheduler) read the files the user meant."""
        from gptrain.config import Config, dump_toml, load_toml
        from gptrain.config_aliases import DEEPSPEED_FLAGS
        from gptrain.config_options import canonical_key, split_options

        from gptrain.jobs.elastic import check_worlds

        base = Path.cwd()
        check_worlds(self, self.trainer_config())
        args = []
        for name, value, tokens in split_options(self.args):
            if canonical_key(name) == "train.output_dir":
                if self.names_its_own_folder(value):
                    continue  # it writes there anyway (the hosted tutorials' /output-checkpoint)
                raise UserError(f"{' '.join(tokens)}: a job writes its checkpoints, metrics and logs "
                                f"into its own folder ($GPTRAIN_HOME/jobs/{self.name}); drop the flag and "
                                f"get them with `gptrain checkpoints {self.name}` or `gptrain fetch {self.name}`")
            key = canonical_key(name)
            names_a_file = key in PATH_KEYS or name in DEEPSPEED_FLAGS
            resolved = absolute_path(key, value, base) if names_a_file and value else value
            if key == "data.mix" and value:
                resolved = absolute_mix(value, base)
            args += tokens if resolved == value else [f"--{name}={resolved}"]
        self.args = args
        if self.config is not None:
            cfg = load_toml(self.config_path or "the job's config", Config(), text=self.config)
            if absolute_paths(cfg, base):
                self.config = dump_toml(cfg)
        if engine(self.scheduler).workers_here:  # what they would trip on is one line now
            cfg = self.trainer_config()
            missing_paths(cfg, base)  # (a cluster's workers may see other paths)
            if cfg.data.path and Path(cfg.data.path).is_file():
                from gptrain.data.sources import check_file_kind

                check_file_kind(cfg.data.path)  # (a .csv was refused by every worker, after the record)
            if (hub := hub_id(cfg.model.init_from, base)) is not None:
                from gptrain.models.hub import check_fetchable

                check_fetchable(hub)
            if cfg.model.attn_implementation == "flash_attention_2":
                from gptrain.models.flash import check_available

                check_available()  # not a traceback from every worker

    def names_its_own_folder(self, value) -> bool:
        """Whether an --output_dir value is this job's own folder, or its checkpoints folder,
        however it is spelled (the variable a worker gets, or the path)."""
        from gptrain.jobs import folder

        if value is None:
            return False
        if value.strip("${}") in ("GPTRAIN_CHECKPOINT_DIR", "GPTRAIN_OUTPUT_DIR"):
            return True
        if "$" in value or is_url(value):
            return False
        jdir = folder.job_dir(self.name)
        return Path(value).expanduser().resolve() in (jdir.resolve(), folder.checkpoints_dir(jdir).resolve())

    def trainer_config(self):
        """The trainer Config this job will run with (trainer jobs only); errors name the
        user's config file."""
        from gptrain.config import Config, load_toml
        from gptrain.config_options import parse_train_args

        cfg = Config()
        if self.config is not None:
            load_toml(self.config_path or "the job's config", cfg, text=self.config)
        return parse_train_args(list(self.args), cfg)


BUILTIN_TOKENIZERS = ("gpt2", "char", "byte")


def absolute_path(key: str, value: str, base: Path) -> str:
    """`value` of the path setting `key` made absolute when it is a relative path that exists
    under `base`. A bare word that is a pushed dataset's name stays a name (data/store.py's rule),
    and so does anything that does not exist there (a hub id, a checkpoint ID, "auto", a URL)."""
    from gptrain.data.store import is_path, registered

    if is_url(value) or value in BUILTIN_TOKENIZERS:
        return value
    p = base / Path(value).expanduser()
    if p.exists() and (key != "data.path" or is_path(value) or not registered(value)):
        return str(p.resolve())
    return value


def missing_paths(cfg, base: Path) -> None:
    """Refuse a path setting written as a path (/, ./, ../, ~) that names nothing, at submit,
    where the job's workers will look for it: one line, with the nearest name beside it."""
    import difflib

    for key in ("model.init_from", "data.path", "data.tokenizer", "checkpoint.resume_from"):
        section, name = key.split(".")
        value = getattr(getattr(cfg, section), name) or ""
        if "$" in value or is_url(value) or not value.startswith(("/", "./", "../", "~")):
            continue  # a name, a hub id, a URL, auto/none, or a path the job's environment fills in
        p = base / Path(value).expanduser()
        if p.exists():
            continue
        near = difflib.get_close_matches(p.name, [c.name for c in p.parent.iterdir()], n=1, cutoff=0.6) \
            if p.parent.is_dir() else []
        raise UserError(f"--{key} {value}: no such file or folder"
                        + (f" (did you mean {value[:len(value) - len(p.name)] + near[0]!r}?)" if near else ""))


def hub_id(value: str, base: Path) -> str | None:
    """The Hugging Face Hub repository ("owner/name") model.init_from names, or None: a path,
    job, checkpoint or URL here is not one (jobs/found.model_source decides, as the trainer will;
    `hf:NAME` is the hub's NAME)."""
    import re

    if not value or is_url(value) or (base / Path(value).expanduser()).exists():
        return None
    from gptrain.jobs import found

    source = found.model_source(value)
    plain = value[3:] if value.startswith("hf:") else value
    return source if source == plain and re.fullmatch(r"[\w.-]+/[\w.-]+", source) else None


def absolute_mix(value: str, base: Path) -> str:
    """data.mix (NAME:WEIGHT,...) with each NAME resolved as absolute_path resolves data.path."""
    entries = [entry.rpartition(":") for entry in value.split(",")]
    return ",".join(f"{absolute_path('data.path', name.strip(), base) if colon else ''}{colon}{w}"
                    for name, colon, w in entries)


def absolute_paths(cfg, base: Path) -> bool:
    """absolute_path on every path setting of a Config; whether anything changed."""
    changed = False
    if cfg.data.mix and absolute_mix(cfg.data.mix, base) != cfg.data.mix:
        cfg.data.mix, changed = absolute_mix(cfg.data.mix, base), True
    for key in PATH_KEYS:
        section, name = key.split(".")
        value = getattr(getattr(cfg, section), name)
        if isinstance(value, str) and value and absolute_path(key, value, base) != value:
            setattr(getattr(cfg, section), name, absolute_path(key, value, base))
            changed = True
    return changed


def parse_env(pairs: list[str], flag: str = "--env") -> dict[str, str]:
    """KEY=VALUE pairs of --env (or --secret, where a bare KEY takes its value from this shell's
    environment, keeping it out of the command line and the shell history)."""
    import os

    env = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq and flag == "--secret" and key in os.environ:
            value = os.environ[key]
        elif not eq and flag == "--secret" and not ENV_NAME.fullmatch(key):  # a value typed alone?
            raise UserError("--secret takes KEY=VALUE or the name of a variable set in this shell; "
                            "an argument is neither (not shown: it may be the secret)")
        elif not eq:
            raise UserError(f"{flag} {pair!r} is not KEY=VALUE" + (
                f" (and {key} is not set in this shell)" if flag == "--secret" else ""))
        check_env({key: value}, flag)
        env[key] = value
    return env


def check_scheduler_options(kind: str, opts: dict, known, forms: dict, flag=lambda key: f"--{key}") -> None:
    """A scheduler's options (a job's `slurm:`, `kubernetes:` or `ray:`): one line naming an unknown one,
    a value not of its form (forms: key -> (compiled regex, what it must be, in words)), a bad
    port or accelerator kind."""
    for key in opts:
        if key not in known:
            raise UserError(f"unknown {kind} option {key!r}{closest(str(key), known)}; use {', '.join(known)}")
    for key, (form, words) in forms.items():
        value = opts.get(key)
        if value is not None and not (isinstance(value, str) and form.fullmatch(value)):
            raise UserError(f"{flag(key)} {value!r} is not {words}")
    port = opts.get("port")  # (the rendezvous port and the kind of --accels: every engine's)
    if port is not None and (not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536):
        raise UserError(f"--port must be a TCP port (1-65535), got {port!r}")
    if opts.get("accel_type", "auto") not in ("auto", "gpu", "cpu"):
        raise UserError(f"--accel-type must be auto, gpu or cpu, got {opts['accel_type']!r}")


def check_env(values: dict, flag: str) -> None:
    """Environment variable names a shell and Slurm accept, and string values."""
    for key, value in values.items():
        if not isinstance(key, str) or not ENV_NAME.fullmatch(key):
            raise UserError(f"invalid {flag} name {key!r}: use letters, digits and _, not starting "
                            "with a digit")
        if not isinstance(value, str) or "\0" in value:  # (the value is not shown: it may be secret)
            raise UserError(f"{flag} {key} must be a string without NUL characters")


# field -> (accepted types, what to write); a list field's items must be str (or, for args,
# env and secrets in a job.yaml, a number or boolean, taken as text)
TYPES = {"name": ((str,), "a string (quote it)"), "nodes": ((int, str), "a whole number or MIN:MAX"),
         "min_nodes": ((int,), "a whole number"), "keep_on_failure": ((int, float), "seconds"),
         "accels": ((int,), "a whole number"), "max_restarts": ((int,), "a whole number"),
         "datasets": ((list,), "a list of dataset names"), "env": ((dict,), "a mapping of NAME: value"),
         "secrets": ((dict,), "a mapping of NAME: value"), "scheduler": ((str,), "local, slurm, kubernetes or ray"),
         "config": ((str, dict), "a TOML file path or a mapping of [sections]"),
         "config_path": ((str,), "a path"), "args": ((list,), "a list of arguments"),
         "script": ((str,), "a script path"), "slurm": ((dict,), "a mapping (partition, time, ...)"),
         "kubernetes": ((dict,), "a mapping (image, volume, queue, ...)"),
         "ray": ((dict,), "a mapping (address)"),
         **{k: ((str,), "a string") for k in ("entry", "module", "command", "code", "repository_url",
                                               "ref", "commit", "source", "requirements", "python",
                                               "resume_args", "requirements_file")}}
SCALARS = (str, int, float, bool)


def check_types(fields: dict, where: str = "") -> None:
    """Each field of the right type: one line naming the field and what it must be."""
    for key, value in fields.items():
        if value is None or key not in TYPES:
            continue
        types, words = TYPES[key]
        wrong = not isinstance(value, types) or (isinstance(value, bool) and bool not in types) or \
            (key == "nodes" and isinstance(value, str) and not NODES.fullmatch(value))
        items = value.values() if isinstance(value, dict) and key in ("env", "secrets") else \
            value if isinstance(value, list) else ()
        item_types = (str,) if key == "datasets" else SCALARS
        bad = next((v for v in items if not isinstance(v, item_types)), None) if not wrong else None
        if wrong or bad is not None:
            got = value if wrong else bad
            what = words if wrong else f"{words} (strings{'' if key == 'datasets' else ' or numbers'})"
            shown = "" if key == "secrets" else f" {got!r}"  # a malformed secret is still a secret
            raise UserError(f"{key}{where} must be {what}, got {type(got).__name__}{shown}")
