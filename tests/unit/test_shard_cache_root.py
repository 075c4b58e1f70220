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
