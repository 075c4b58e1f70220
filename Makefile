# Set-up on a fresh machine needs only Python >= 3.10, pip and gcc: every target below builds
# its own virtualenv first. torch is pinned first so that nothing pulls a newer (CUDA) build.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
TORCH  ?= torch==2.13.0

.PHONY: install demo test test-fast test-gpu browser podman bwrap ray s3 clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH)"
	$(PY) -m pip install --quiet -e ".[hf,ui,dev,kubernetes]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	PATH="$(abspath $(VENV))/bin:$$PATH" bash scripts/demo.sh

# The browser tests (tests/browser) drive Debian's chromium through chromium-driver: installed
# here when missing on a Debian machine where we are root; elsewhere they skip, saying why.
browser:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && [ -f /etc/debian_version ]; then \
		apt-get install -y -qq chromium chromium-driver >/dev/null || \
		{ apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null; } || \
		echo "make: could not install chromium: browser tests will skip"; \
	else echo "make: not root on Debian: browser tests will skip (apt-get install chromium chromium-driver)"; fi

# The Kubernetes pod test (tests/kubernetes/test_podman.py) runs a job's pod under podman kube
# play with runc: installed here when missing on a Debian machine where we are root; elsewhere
# it skips, saying why.
podman:
	@if command -v podman >/dev/null && command -v runc >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && [ -f /etc/debian_version ]; then \
		apt-get install -y -qq podman runc catatonit >/dev/null || \
		{ apt-get update -qq && apt-get install -y -qq podman runc catatonit >/dev/null; } || \
		echo "make: could not install podman: the Kubernetes pod test will skip"; \
	else echo "make: not root on Debian: the Kubernetes pod test will skip (apt-get install podman runc catatonit)"; fi

# Interactive sessions (gptrain session) mount /input and /output-checkpoint with bubblewrap:
# installed here when missing on a Debian machine where we are root; elsewhere their tests skip.
bwrap:
	@if command -v bwrap >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && [ -f /etc/debian_version ]; then \
		apt-get install -y -qq bubblewrap >/dev/null || \
		{ apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null; } || \
		echo "make: could not install bubblewrap: the session tests will skip"; \
	else echo "make: not root on Debian: the session tests will skip (apt-get install bubblewrap)"; fi

# Ray (the gptrain[ray] extra) for tests/ray, which start a two-node Ray cluster on this
# machine; `install` and `demo` stay without it. Where it cannot be installed they skip, saying why.
ray: $(STAMP)
	@$(PY) -c "import ray" 2>/dev/null || $(PY) -m pip install --quiet -e ".[ray]" || \
		echo "make: could not install ray: tests/ray will skip (pip install 'gptrain[ray]')"

# s3fs and moto's S3 server for tests/s3 (training from s3:// through a real S3 API on 127.0.0.1),
# in a second small virtualenv: botocore pins python-dateutil<3, the kubernetes client in $(VENV)
# needs a newer one. It sees $(VENV)'s packages after its own (torch is not downloaded twice):
# scripts/s3_venv.sh. Where it cannot be built, tests/s3 skip, saying `make s3`.
S3VENV := .venv-s3
$(S3VENV)/.installed-stamp: $(STAMP) scripts/s3_venv.sh
	bash scripts/s3_venv.sh $(PY) $(S3VENV) || { rm -rf $(S3VENV); echo "make: could not build $(S3VENV): tests/s3 will skip"; }

s3: $(S3VENV)/.installed-stamp

# Two workers (pytest-xdist), each taking whole test files, or a whole folder where its tests share
# one cluster (tests/conftest.py): the suite's tests wait on processes, clusters and browsers for
# much of their time. One thread per process: two workers and their subprocesses already fill the
# two cores, and OpenMP threads spin while they wait for a core.
# It ends with the 30 slowest tests and its own wall time (GPTRAIN_TEST_TIMES=FILE: each test's
# time as it finishes, tests/conftest.py).
test: $(STAMP) browser podman bwrap ray s3
	@start=$$(date +%s); OMP_NUM_THREADS=1 $(PY) -m pytest -q -n 2 --dist loadgroup --durations=30 tests; \
		code=$$?; echo "make test: the suite took $$(( $$(date +%s) - start )) s"; exit $$code

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow" tests

clean:
	rm -rf $(VENV) $(S3VENV) .pytest_cache demo-out

# The CUDA checks (tests/gpu): on a machine with an NVIDIA GPU; elsewhere they skip.
test-gpu: $(STAMP)
	$(PY) -m pytest -q tests/gpu
