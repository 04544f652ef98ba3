# Every target does its own set-up on a fresh Debian machine with Python 3.11 (venv, pip, mosquitto).
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
EXTRAS ?= cpu,build,cloud,plots,dev
PYTEST_ARGS ?=

.PHONY: help setup mosquitto lint typecheck test test-pythons test-fast demo bench model clean

help:
	@echo "make demo   build the model and run the bundle on a simulated Greengrass core"
	@echo "make test   lint, type-check and run the whole test suite"
	@echo "make bench  run the benchmarks and record them under bench/results/"
	@echo "make test-fast  the tests without the slow ones (no lint, no type-check)"
	@echo "make test-pythons  the device-side tests on Python 3.10 and 3.12 (part of make test)"
	@echo "make model  build the INT8 model stores only (the classifier and the detector)"
	@echo "make clean  remove build outputs, the model store and caches (not .venv)"
	@echo "make setup  the venv with the project and its extras, and mosquitto (what the others need)"
	@echo "make lint   ruff check and ruff format --check;  make typecheck  mypy"

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet --progress-bar off -e ".[$(EXTRAS)]"
	@touch $@

setup: $(STAMP) mosquitto

# The simulated core starts its own broker on a free port; it only needs the binary (and the README's
# examples use mosquitto_pub / mosquitto_sub). Debian's darknet package brings Darknet's test photos
# (/usr/share/darknet/data), the detector build's held-out set; nothing reads them at run time.
# GStreamer's RTSP server (run by Debian's python3 with python3-gi) serves the stream tests' cameras.
mosquitto:
	@if ! { command -v mosquitto || [ -x /usr/sbin/mosquitto ]; } >/dev/null || ! command -v mosquitto_pub >/dev/null \
	    || [ ! -f /usr/share/darknet/data/person.jpg ] || ! ls /usr/lib/*/gstreamer-1.0/libgstx264.so >/dev/null 2>&1 \
	    || ! /usr/bin/python3 -c "import gi; gi.require_version('GstRtspServer', '1.0')" 2>/dev/null; then \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq mosquitto mosquitto-clients darknet \
	    python3-gi gir1.2-gst-rtsp-server-1.0 gstreamer1.0-plugins-base gstreamer1.0-plugins-good gstreamer1.0-plugins-ugly >/dev/null; \
	fi

lint: $(STAMP)
	$(BIN)/ruff check components cloud bench tests
	$(BIN)/ruff format --check components cloud bench tests

typecheck: $(STAMP)
	$(BIN)/mypy

# The e2e suite runs twice: as the classic nucleus (with everything else) and as nucleus lite, whose
# limits (recipe size, IPC and IoT Core message sizes, no MQTT 5 properties) the simulator enforces.
test: setup lint typecheck
	$(BIN)/python -m pytest $(PYTEST_ARGS)
	$(BIN)/python -m pytest --sim-nucleus lite tests/e2e $(PYTEST_ARGS)
	@$(MAKE) --no-print-directory test-pythons

# The device side on the other Pythons a device may run (the venv above is 3.11), all at once: one
# venv per Python from an interpreter found here (on PATH or under pyenv, never downloaded) with the
# pins the installer gives a device on that Python plus the test tools, then the unit tests that need
# no developer tool (tests/helpers/pythons.py, device_leg.py). An absent Python is skipped, saying so.
DEVICE_PYTHONS ?= 3.10 3.12

test-pythons: $(STAMP)
	$(BIN)/python -m tests.helpers.pythons legs $(VENV)/legs $(DEVICE_PYTHONS)

test-fast: setup
	$(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

model: setup
	$(BIN)/edgeinfer model build
	$(BIN)/edgeinfer model build --task detection

demo: setup model
	$(BIN)/edgeinfer demo

bench: setup model
	$(BIN)/edgeinfer bench model --json bench/results/model.json
	$(BIN)/edgeinfer bench model --detector --json bench/results/model-detector.json
	$(BIN)/edgeinfer bench runtime --runs 3 --json bench/results/runtime.json
	$(BIN)/edgeinfer bench sim --json bench/results/sim.json
	$(BIN)/edgeinfer bench telemetry --json bench/results/telemetry.json
	$(BIN)/edgeinfer bench offload --json bench/results/offload.json
	$(BIN)/edgeinfer bench iot --json bench/results/iot.json
	$(BIN)/edgeinfer bench models --rounds 6 --against plain --json bench/results/models.json
	$(BIN)/edgeinfer bench capture --json bench/results/capture.json
	$(BIN)/edgeinfer bench streams --json bench/results/streams.json

clean:
	rm -rf build artifacts greengrass-build .edgeinfer .pytest_cache .mypy_cache .ruff_cache
