"""A URL's shards are cached on this host's own disk, in a folder private to the user, never in
$GPTRAIN_HOME (which a multi-host job shares over the network): data/remote_shards.cache_root."""

import os
import stat

import pytest

from gptrain.data.remote_shards import cache_root
from gptrain.errors import UserError


def test_the_default_is_a_private_folder_in_tmpdir_not_the_home(tmp_path, monkeypatch, isolated_home):
    monkeypatch.delenv("GPTRAIN_CACHE_DIR")
    monkeypatch.setenv("TMPDIR", str(tmp_path / "local-disk"))
    (tmp_path / "local-disk").mkdir()
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    root = cache_root()
    assert root == tmp_path / "local-disk" / f"gptrain-cache-{os.geteuid()}"
    assert stat.S_IMODE(root.stat().st_mode) == 0o700 and isolated_home not in root.parents
    assert cache_root(str(tmp_path / "mine")) == tmp_path / "mine"  # data.cache_dir first


def test_a_folder_others_may_write_or_own_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(UserError, match="not a folder of your own that only you can write"):
        cache_root(str(shared))
    if os.geteuid() == 0:
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o700)
        os.chown(theirs, 65534, 65534)
        with pytest.raises(UserError, match="not a folder of your own"):
            cache_root(str(theirs))
    link = tmp_path / "link"
    link.symlink_to(tmp_path)
    with pytest.raises(UserError, match="not a folder of your own"):
        cache_root(str(link))


def test_a_default_folder_another_user_made_first_moves_the_cache_to_the_users_own(tmp_path, monkeypatch,
                                                                                  isolated_home, capsys):
    """#47 row 5: another uid pre-created $TMPDIR/gptrain-cache-<uid> world-writable and the
    owner's URL training was refused. Named by the user it still is; the default moves to
    $XDG_CACHE_HOME/gptrain, with a note."""
    import tempfile

    monkeypatch.delenv("GPTRAIN_CACHE_DIR", raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(tempfile, "tempdir", None)
    planted = tmp_path / "tmp" / f"gptrain-cache-{os.geteuid()}"
    planted.mkdir(parents=True)
    planted.chmod(0o777)  # (as another user's would be: one this user may not keep to itself)
    root = cache_root()
    assert root == tmp_path / "xdg" / "gptrain" and stat.S_IMODE(root.stat().st_mode) == 0o700
    assert "another user made it" in capsys.readouterr().err
    with pytest.raises(UserError, match="not a folder of your own"):
        cache_root(str(planted))
