# kvreshard: the two commands of a fresh machine are `go run ./cmd/kvreshard demo` and `make test`.
GO ?= go
FUZZTIME ?= 30s
# Shrinking a new input may take up to a minute by default; bound it so
# that a run ends when FUZZTIME says.
FUZZFLAGS = -run '^$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 5s

.PHONY: test generate check-generated fuzz bench gobench vet python venv

# The kernels again without their assembly (the purego tag), as on other
# architectures.
test: vet venv
	$(GO) test -race -count=1 ./...
	$(GO) test -count=1 -tags purego ./runtime/kernel/... ./testkit/kernelcheck ./layouts ./examples/customlayout

vet:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || (gofmt -l $$(git ls-files '*.go'); echo "gofmt: files above need formatting"; exit 1)
	$(GO) vet ./...

# python builds the C library into the Python package, so that
# PYTHONPATH=python .venv/bin/python -c 'import kvreshard' works from the
# repository (pip install --no-build-isolation ./python does the same).
python:
	$(GO) build -buildmode=c-shared -o python/kvreshard/libkvreshard.so ./cmd/libkvreshard

# venv makes .venv: the pinned Python dependencies of the tests, Mooncake's
# wheel, and the package itself (built from this tree, its library
# included), again whenever any of them changed. The Python tests run in it.
PYTHON ?= python3
VENV = .venv
venv: $(VENV)/.installed
$(VENV)/.installed: python/requirements.txt python/requirements-nodeps.txt python/pyproject.toml python/setup.py \
		$(shell git ls-files 'python/kvreshard/*' '*.go' '*.h' '*.c' go.mod go.sum)
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check -r python/requirements.txt
	$(VENV)/bin/pip install -q --disable-pip-version-check --no-deps -r python/requirements-nodeps.txt
	$(VENV)/bin/pip install -q --disable-pip-version-check --no-build-isolation --no-deps --force-reinstall ./python
	rm -rf python/build python/*.egg-info
	touch $@

generate:
	$(GO) generate ./...
	$(GO) test -count=1 -run '^TestGeneratedFilesUpToDate$$' ./testkit/kernelcheck -update

check-generated:
	$(GO) run ./cmd/kvlc -check -o layouts/builtin_kvl.go -pkg layouts layouts/builtin.kvl
	$(GO) run ./cmd/kvlc -check -o examples/customlayout/custom_kvl.go -pkg customlayout examples/customlayout/custom.kvl
	$(GO) test -count=1 -run '^TestGeneratedFilesUpToDate$$' ./testkit/kernelcheck

fuzz:
	$(GO) test $(FUZZFLAGS) -fuzz '^FuzzParse$$' ./dsl
	$(GO) test $(FUZZFLAGS) -fuzz '^FuzzOrder$$' ./dsl
	$(GO) test $(FUZZFLAGS) -fuzz '^FuzzDecode$$' ./runtime/manifest
	$(GO) test $(FUZZFLAGS) -fuzz '^FuzzSpecs$$' ./cmd/kvreshard
	$(GO) test $(FUZZFLAGS) -fuzz '^FuzzBuild$$' ./internal/spec
	$(GO) test $(FUZZFLAGS) -fuzz '^FuzzParseURL$$' ./runtime/store/redisstore
	$(GO) test $(FUZZFLAGS) -fuzz '^FuzzDecodeState$$' ./runtime/store/redisstore
	$(GO) test $(FUZZFLAGS) -fuzz '^FuzzParseClaim$$' ./runtime/store/filestore
	$(GO) test $(FUZZFLAGS) -fuzz '^FuzzParseTransports$$' ./runtime/plan
	$(GO) test $(FUZZFLAGS) -fuzz '^FuzzOrderParsersAgree$$' ./compiler

# bench runs the benchmark suite (figures against their baselines);
# gobench the packages' Go benchmarks.
bench:
	$(GO) run ./cmd/kvreshard bench

gobench:
	$(GO) test -run '^$$' -bench . -benchmem ./...
