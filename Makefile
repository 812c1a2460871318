# Export service: make help lists the targets.
.DEFAULT_GOAL := help
SHELL := /bin/bash
MODULES := pkg gateway services/export-reader services/sales-writer services/shop-schema
# go.work names the toolchain (its toolchain line); auto lets the go command
# fetch it where the machine's Go is older and set to local.
export GOTOOLCHAIN ?= auto

.PHONY: help build run test drill fuzz vulncheck lint bench trace clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-9s %s\n", $$1, $$2}'

build: ## build every binary into bin/
	@mkdir -p bin
	@for m in $(MODULES); do \
	  if [ -f $$m/main.go ]; then go build -o bin/$$(basename $$m) ./$$m || exit 1; fi; \
	done
	@go build -o bin/exportctl ./pkg/cmd/exportctl
	@go build -o bin/tracestore ./pkg/cmd/tracestore
	@go build -o bin/logcap ./pkg/cmd/logcap
	@ls bin

run: ## start the whole stack natively (PostgreSQL + Redis under .run/), demo data and keys
	@deploy/local/run.sh --check
	@$(MAKE) --no-print-directory build
	@deploy/local/run.sh

test: ## run every test of every module against real PostgreSQL and Redis
	@deploy/local/test.sh

drill: ## the sale state machine checked as a history under faults, on a stack of its own (services/sales-writer/README.md)
	@deploy/local/salesdrill.sh

FUZZTIME ?= 30s
fuzz: ## run every Fuzz target of every module for FUZZTIME each (30s), one at a time: make fuzz FUZZTIME=2m
	@FUZZTIME=$(FUZZTIME) deploy/local/fuzz.sh

vulncheck: ## govulncheck over every module: known vulnerabilities the code can reach (VULNDB=module: a pinned offline snapshot)
	@deploy/local/vulncheck.sh

lint: ## gofmt, go mod tidy -diff, go vet (and staticcheck when installed) over every module
	@unformatted=$$(gofmt -l $(MODULES)); if [ -n "$$unformatted" ]; then echo "make lint: not gofmt-formatted (gofmt -w them):"; echo "$$unformatted"; exit 1; fi
	@for m in $(MODULES); do (cd $$m && go mod tidy -diff >/dev/null) || { echo "make lint: $$m/go.mod is not tidy (cd $$m && go mod tidy)"; exit 1; }; done
	@for m in $(MODULES); do (cd $$m && go vet ./...) || exit 1; done
	@if command -v staticcheck >/dev/null; then for m in $(MODULES); do (cd $$m && staticcheck ./...) || exit 1; done; \
	else echo "make lint: staticcheck is not on PATH, so it did not run (go vet did): see README, \"Other make targets\""; fi

# Without ID, tracestore's own usage (tracestore show [--file F] REQUEST_ID)
# named neither make trace nor ID=.
trace: ## print the trace of one request of make run: make trace ID=<meta.request_id>
	@if [ -z "$(strip $(ID))" ]; then echo "usage: make trace ID=<meta.request_id>" >&2; exit 2; fi
	@bin/tracestore show --file .run/traces.jsonl $(ID)

bench: build ## measure the product against its baselines (BENCH_ITEMS, BENCH_QUICK=1)
	@deploy/local/bench.sh

clean: ## stop nothing, remove bin/ (keep .run/ data: rm -rf .run to reset)
	rm -rf bin
