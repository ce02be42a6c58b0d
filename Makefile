# Two entry points for people: `make run` (a dev cluster on 127.0.0.1:8000) and `make test`.
# Both depend on `install`, which builds .venv once and again only when a pyproject changes.

VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PKGS := $(patsubst %/pyproject.toml,%,$(wildcard libs/*/pyproject.toml services/*/pyproject.toml bench/pyproject.toml))
PYTEST_ARGS ?=

.PHONY: install run test bench clean

install: $(STAMP)

$(STAMP): $(addsuffix /pyproject.toml,$(PKGS)) requirements-dev.txt constraints.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -c constraints.txt hatchling
	$(PY) -m pip install -q --disable-pip-version-check --no-build-isolation -c constraints.txt \
		$(addprefix -e ,$(PKGS)) -r requirements-dev.txt
	touch $(STAMP)

run: install
	$(VENV)/bin/crescent up

test: install
	$(PY) -m pytest $(PYTEST_ARGS)

bench: install
	mkdir -p bench/results
	$(VENV)/bin/crescent bench control-plane --json bench/results/control-plane.json

clean:
	rm -rf $(VENV) .crescent
