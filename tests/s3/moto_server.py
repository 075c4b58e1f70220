"""moto's S3 server for tests/s3, started from the main interpreter: `serve(FOLDER)` runs
tests/s3/moto_s3.py on .venv-s3's interpreter (S3PY: `make s3`; s3fs and moto cannot live in the
main virtualenv), which uploads FOLDER to s3://data/web/ and serves until the context ends;
it yields moto_s3.py's JSON line ({"endpoint", "key", "secret", "meta_only"}). Not a test module."""

import contextlib
import json
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
S3PY = ROOT / ".venv-s3" / "bin" / "python"


@contextlib.contextmanager
def serve(folder: Path):
    server = subprocess.Popen([S3PY, ROOT / "tests" / "s3" / "moto_s3.py", folder, "data", "web"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline()
        assert line, "the moto server did not start"
        yield json.loads(line)
    finally:
        server.stdin.close()
        server.wait(timeout=30)


def env_of(info: dict, endpoint: str | None = None) -> dict:
    """The environment a process reads the bucket with: the trainer's keys, `endpoint` (else moto's)."""
    return {"AWS_ACCESS_KEY_ID": info["key"], "AWS_SECRET_ACCESS_KEY": info["secret"],
            "FSSPEC_S3_ENDPOINT_URL": endpoint or info["endpoint"], "AWS_DEFAULT_REGION": "us-east-1"}
