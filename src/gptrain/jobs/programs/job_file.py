"""A job file (`gptrain run --job-file job.yaml`, or a cloud job service's own file): its fields,
read as plain YAML data and checked, for JobSpec (jobs/spec.py) to validate with any CLI overrides."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from gptrain.errors import UserError, closest
from gptrain.files import parse_user_text, read_user_text, shown
from gptrain.jobs.spec import JobSpec, check_types


def read_config_file(path: str, what: str = "config file") -> str:
    """A file a job names (its TOML config, its requirements), read bounded (files.read_user_text)."""
    return read_user_text(path, what)


YAML_KEYS = {f.name for f in dataclasses.fields(JobSpec)} - {"config_path", "commit", "python", "entry", "min_nodes"}


def from_yaml(path: str) -> dict:
    """The fields of a job.yaml (validated later, together with any CLI overrides), and under
    "notes" what of a cloud job file was left out (for the caller to say)."""
    import yaml

    text = read_user_text(path, "job file")
    try:
        data = parse_user_text(yaml.safe_load, text, f"job file {shown(path)}")
    except yaml.YAMLError as e:
        raise UserError(f"job file {path} is not valid YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise UserError(f"job file {path} must be a mapping of fields (name, nodes, accels, ...)")
    from gptrain.jobs.programs import cloud_job

    notes = []
    if cloud_job.is_cloud_job(data):  # the cloud job service's own file (jobs/programs/cloud_job.py)
        data, notes = cloud_job.translate(data, path)
    elif "kind" in data:
        raise UserError(f"job file {path}: a `kind:` file is read as a cloud job file only with kind "
                        f"{' or '.join(cloud_job.KINDS)} and a `spec:` mapping (docs/jobs-code.md)")
    for key in data:
        if key not in YAML_KEYS:
            raise UserError(f"unknown field {key!r} in {path}{closest(str(key), YAML_KEYS)}")
    data = {k: v for k, v in data.items() if v is not None}
    elastic = re.search(r"^nodes\s*:\s*[\"']?(\d+\s*:\s*\d+)[\"']?\s*(#.*)?$", text, re.M)
    if elastic:  # unquoted, YAML 1.1 reads `nodes: 1:2` as a base-60 number (62)
        data["nodes"] = elastic.group(1)
    check_types(data, f" in {path}")
    base = Path(path).expanduser().resolve().parent
    if isinstance(data.get("config"), dict):
        from gptrain.config import Config, dump_toml
        from gptrain.config_options import apply_option

        cfg = Config()
        for section, values in data["config"].items():
            if not isinstance(values, dict):
                raise UserError(f"config.{section} in {path} must be a mapping")
            for key, value in values.items():
                try:
                    apply_option(cfg, f"{section}.{key}", value if isinstance(value, str) else _yaml_scalar(value))
                except UserError as e:
                    raise UserError(f"{path}: config: {e}") from None
        data["config"], data["config_path"] = dump_toml(cfg), f"{path} (config:)"
    elif isinstance(data.get("config"), str):
        cfg_path = Path(data["config"]).expanduser()
        cfg_path = cfg_path if cfg_path.is_absolute() else base / cfg_path
        data["config"], data["config_path"] = read_config_file(str(cfg_path)), str(cfg_path)
    if isinstance(data.get("code"), str):
        data["code"] = str(base / Path(data["code"]).expanduser())
    elif isinstance(data.get("script"), str) and not Path(data["script"]).is_absolute() \
            and not data.get("repository_url") and not data.get("source"):
        data["script"] = str(base / data["script"])
    if isinstance(data.get("requirements"), str) and (data.get("repository_url") or data.get("source")):
        data["requirements_file"] = data.pop("requirements")  # the repository's own (jobs/programs/code.py)
    elif isinstance(data.get("requirements"), str):
        data["requirements"] = read_config_file(str(base / Path(data["requirements"]).expanduser()),
                                                "requirements file")
    data["args"] = [str(a) for a in data.get("args", [])]
    for key in ("env", "secrets"):
        data[key] = {k: str(v) for k, v in (data.get(key) or {}).items()}
    return {**data, "notes": notes}


def _yaml_scalar(value):
    if isinstance(value, dict):  # a table ({data: {mix: {web: 0.7}}}): config.convert takes it or says no
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)
