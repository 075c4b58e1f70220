#!/usr/bin/env bash
# `make s3`: a second, small virtualenv for the S3 tests (tests/s3/test_s3_moto.py).
# s3fs (aiobotocore, botocore) pins python-dateutil<3 while the kubernetes client in the main
# virtualenv needs a newer one, so they cannot share it. This one holds only s3fs (the release
# of the main virtualenv's fsspec) and moto's S3 server with their own pins; a .pth file then
# adds the main virtualenv's site-packages AFTER its own, so torch, numpy and gptrain (the
# editable install) come from there, without a second download, and dateutil, botocore and
# fsspec from here.
#   usage: scripts/s3_venv.sh MAIN_PYTHON S3_VENV
set -euo pipefail
main_py=$1 venv=$2
rm -rf "$venv"
"$main_py" -m venv "$venv"
fsspec_version=$("$main_py" -c 'import fsspec; print(fsspec.__version__)')
"$venv/bin/python" -m pip install --quiet "s3fs==$fsspec_version" "moto[s3]" flask flask-cors
main_site=$("$main_py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
own_site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# a line starting with `import` is run by site.py: addsitedir also reads that folder's .pth
# files (the editable gptrain); plain path lines would not
echo "import site; site.addsitedir('$main_site')" > "$own_site/zz-gptrain-main-venv.pth"
"$venv/bin/python" -c 'import dateutil, s3fs, moto.server, torch, gptrain'
touch "$venv/.installed-stamp"
