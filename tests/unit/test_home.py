"""$GPTRAIN_HOME is made private (0700) by whichever process needs it first; one another user
owns is refused (they could change what the user's jobs run), and one of the user's own that
others may write is made private again (#47 round 3: a home another uid pre-made 0777 was used,
and its secrets/*.env swapped to run that uid's sitecustomize.py as the victim)."""

import os
from pathlib import Path

import pytest

from gptrain.errors import UserError
from gptrain.home import make_private as private_home


@pytest.fixture(autouse=True)
def keep_umask():
    """make_private sets this process's umask (077): give the test process its own back."""
    old = os.umask(0o022)
    os.umask(old)
    yield
    os.umask(old)


def test_home_made_by_another_process_a_moment_ago_is_fine(tmp_path, monkeypatch):
    """The ranks of a job start together on a fresh home: another rank creates it between this
    process's look and its mkdir (that interleaving, made certain here, failed a parity run
    with FileExistsError)."""
    home = tmp_path / "home"
    monkeypatch.setenv("GPTRAIN_HOME", str(home))
    real_exists = Path.exists

    def another_rank_wins(self, *args, **kwargs):
        if self == home and not real_exists(self):
            home.mkdir(mode=0o700)  # the other rank, just now
            return False  # what this process saw a moment before
        return real_exists(self, *args, **kwargs)

    monkeypatch.setattr(Path, "exists", another_rank_wins)
    private_home()
    assert home.is_dir()


def test_a_new_home_is_private(tmp_path, monkeypatch):
    monkeypatch.setenv("GPTRAIN_HOME", str(tmp_path / "a" / "home"))
    private_home()
    assert (tmp_path / "a" / "home").stat().st_mode & 0o777 == 0o700


def test_a_home_another_user_owns_is_refused_and_one_open_to_others_is_closed(tmp_path, monkeypatch, capsys):
    home = tmp_path / "home"
    home.mkdir(mode=0o777)
    os.chmod(home, 0o777)
    monkeypatch.setenv("GPTRAIN_HOME", str(home))
    private_home()
    assert home.stat().st_mode & 0o777 == 0o700 and "yours alone again" in capsys.readouterr().err
    if os.getuid() != 0:
        pytest.skip("chown to another uid needs root")
    os.chown(home, 4321, 4321)
    with pytest.raises(UserError, match="belongs to another user"):
        private_home()
