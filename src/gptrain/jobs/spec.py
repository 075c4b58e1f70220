"""What a job is: resources, datasets, environment, and either the built-in trainer (config +
flags) or a user script (+ args). Built from `gptrain run` flags or a job.yaml, validated before
anything is recorded.

    # job.yaml
    name: shakespeare
    nodes: 1
    accels: 2
    datasets: [shakespeare-char]
    env: {OMP_NUM_THREADS: "1"}
    max_restarts: 2
    config: configs/demo.toml          # or an inline table: {train: {max_steps: 100}}
    args: ["--train.max_steps=100"]    # trainer flags, or the script's args when script is set
    # script: my_train.py
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from gptrain.errors import UserError, closest
from gptrain.home import check_name


@dataclass
class JobSpec:
    name: str
    nodes: int = 1
    accels: int = 1
    datasets: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    max_restarts: int = 0
    scheduler: str = "local"
    config: str | None = None          # TOML text of the trainer config (from a file or inline)
    args: list[str] = field(default_factory=list)
    script: str | None = None          # absolute path of the user's script
    slurm: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "JobSpec":
        return cls(**d)

    def validate(self) -> "JobSpec":
        check_name(self.name, "job")
        for key in ("nodes", "accels"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise UserError(f"--{key} must be a whole number >= 1, got {value!r}")
        if not isinstance(self.max_restarts, int) or self.max_restarts < 0:
            raise UserError(f"max restarts must be >= 0, got {self.max_restarts!r}")
        if self.scheduler not in ("local", "slurm"):
            raise UserError(f"unknown scheduler {self.scheduler!r}: use local or slurm")
        from gptrain.data.store import path_of

        for ds in self.datasets:
            path_of(ds)  # refuses unknown datasets
        if self.script is not None:
            p = Path(self.script)
            if not p.is_file():
                raise UserError(f"script {self.script} does not exist")
            self.script = str(p.resolve())
        else:
            self.trainer_config()  # a bad flag or config is refused now, not when the job runs
        return self

    def trainer_config(self):
        """The trainer Config this job will run with (trainer jobs only)."""
        import tempfile

        from gptrain.config import parse_train_args

        argv = list(self.args)
        if self.config is not None:
            with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as f:
                f.write(self.config)
            argv = [f.name, *argv]
        try:
            return parse_train_args(argv)
        finally:
            if self.config is not None:
                Path(argv[0]).unlink(missing_ok=True)


def parse_env(pairs: list[str]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key or not key.replace("_", "a").isalnum():
            raise UserError(f"--env {pair!r} is not KEY=VALUE")
        env[key] = value
    return env


def read_config_file(path: str) -> str:
    try:
        return Path(path).expanduser().read_text()
    except OSError as e:
        raise UserError(f"cannot read config {path}: {e.strerror}") from None


YAML_KEYS = {f.name for f in dataclasses.fields(JobSpec)}


def from_yaml(path: str) -> dict:
    """The fields of a job.yaml (validated later, together with any CLI overrides)."""
    import yaml

    try:
        text = Path(path).expanduser().read_text()
    except OSError as e:
        raise UserError(f"cannot read job file {path}: {e.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise UserError(f"job file {path} is not valid YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise UserError(f"job file {path} must be a mapping of fields (name, nodes, accels, ...)")
    for key in data:
        if key not in YAML_KEYS:
            raise UserError(f"unknown field {key!r} in {path}{closest(str(key), YAML_KEYS)}")
    base = Path(path).expanduser().resolve().parent
    if isinstance(data.get("config"), dict):
        from gptrain.config import Config, apply_option, dump_toml

        cfg = Config()
        for section, values in data["config"].items():
            if not isinstance(values, dict):
                raise UserError(f"config.{section} in {path} must be a mapping")
            for key, value in values.items():
                apply_option(cfg, f"{section}.{key}", value if isinstance(value, str) else _yaml_scalar(value))
        data["config"] = dump_toml(cfg)
    elif isinstance(data.get("config"), str):
        cfg_path = Path(data["config"]).expanduser()
        data["config"] = read_config_file(str(cfg_path if cfg_path.is_absolute() else base / cfg_path))
    if isinstance(data.get("script"), str) and not Path(data["script"]).is_absolute():
        data["script"] = str(base / data["script"])
    for key in ("datasets", "args"):
        if key in data and not isinstance(data[key], list):
            raise UserError(f"{key} in {path} must be a list")
    data["args"] = [str(a) for a in data.get("args", [])]
    data["env"] = {str(k): str(v) for k, v in (data.get("env") or {}).items()}
    return data


def _yaml_scalar(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)
