# SparSEEty — common tasks. `make help` lists them.
PYTHON ?= python3
PYTEST_ARGS ?=

CARGO ?= cargo

.PHONY: help install deps test test-native lint lint-native pcaps bench fuzz fuzz-diff ebpf clean

help:
	@echo "make install  - install sparseety (pip) and the Debian packages it uses"
	@echo "make test     - install what the tests need, then lint and run the whole test suite"
	@echo "make test-native - the native core's Rust tests (cargo test) and clippy"
	@echo "make lint     - ruff, mypy, the import layering contract (lint-imports) and clippy"
	@echo "make pcaps    - re-record the fixtures in pcaps/ from real loopback traffic"
	@echo "make bench    - benchmarks (replay vs tshark, live capture, tokens, diff); prints figures"
	@echo "make fuzz     - fuzz campaign: 100,000 mutated captures and HTTP/SSE/JSON streams, then fuzz-diff"
	@echo "make fuzz-diff - differential fuzz: 10,000 mutated captures and flows stored by the pure"
	@echo "                and the native core (at most 10 min); any difference of the stores fails"
	@echo "make ebpf     - build the eBPF capture object"

install:
	scripts/install-deps.sh --runtime
	-$(MAKE) --no-print-directory ebpf
	$(PYTHON) -m pip install -q --disable-pip-version-check .

deps:
	scripts/install-deps.sh

ebpf:
	sniffer/capture/ebpf/build.sh

lint: lint-native
	ruff check sniffer tests scripts bench
	ruff format --check sniffer tests scripts bench
	mypy
	lint-imports

# The native core (native/: sparseety-core, the PyO3 bindings).
lint-native:
	cd native && $(CARGO) clippy --all-targets -- -D warnings

test-native:
	cd native && $(CARGO) test

test: deps
	-$(MAKE) --no-print-directory ebpf
	$(MAKE) --no-print-directory lint
	$(MAKE) --no-print-directory test-native
	$(PYTHON) -m pytest -q $(PYTEST_ARGS)

pcaps:
	$(PYTHON) scripts/record_pcaps.py
	$(PYTHON) scripts/craft_faults.py
	$(PYTHON) scripts/craft_dialect_pcaps.py
	$(PYTHON) scripts/record_llamacpp.py --if-available
	$(PYTHON) scripts/record_llama_server.py  # skipped unless LLAMA_SERVER=path/to/llama-server
	$(PYTHON) scripts/measure_ttft.py

fuzz:
	$(PYTHON) scripts/fuzz.py --cases $(or $(FUZZ_CASES),100000)
	$(MAKE) --no-print-directory fuzz-diff

fuzz-diff:
	$(PYTHON) scripts/fuzz.py --kind diff --cases $(or $(FUZZ_DIFF_CASES),10000) \
		--seconds $(or $(FUZZ_DIFF_SECONDS),600)

bench: deps
	-$(MAKE) --no-print-directory ebpf
	$(PYTHON) bench/run_all.py

clean:
	rm -rf build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache bench/out native/target
	rm -f sniffer/_native*.so
	rm -f sniffer/capture/ebpf/*.o sniffer/capture/ebpf/vmlinux.h
