# sluice: `make test` installs what the tests need, then runs every test.
GO ?= go

.PHONY: test deps build replay fuzz fault bench

test: deps
	$(GO) vet ./...
	$(MAKE) fuzz
	$(GO) test -race -count=1 -skip '^TestFaultLoad$$' ./...
	$(MAKE) fault

# The fault tests under load (enforcer.TestFaultLoad, about 3 minutes), alone on the machine so that
# other packages' tests do not take its cores: at their default 2 000 requests/s for 30 s per case
# without the race detector (which slows the code it watches tenfold), then briefly under it.
# Locally, shorten them: go test -run TestFaultLoad -fault.duration=5s ./enforcer/
fault:
	$(GO) test -count=1 -run '^TestFaultLoad$$' ./enforcer/
	$(GO) test -race -count=1 -run '^TestFaultLoad$$' -fault.duration=5s -fault.rate=500 ./enforcer/

deps:
	./deploy/ci/deps.sh

build:
	$(GO) build -o sluice ./cmd/sluice

replay:
	$(GO) run ./cmd/sluice replay

# A short run of every fuzzer (decoders and parsers), as CI does.
FUZZTIME ?= 5s
# Minimizing a new interesting input may otherwise take up to 60 s and outlive
# -fuzztime, which fails the run with "context deadline exceeded".
FUZZFLAGS = -fuzztime $(FUZZTIME) -fuzzminimizetime 1s
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzDecode$$' $(FUZZFLAGS) ./pipeline/
	$(GO) test -run '^$$' -fuzz '^FuzzParseLine$$' $(FUZZFLAGS) ./pipeline/accesslog/
	$(GO) test -run '^$$' -fuzz '^FuzzCountMinUnmarshal$$' $(FUZZFLAGS) ./sketch/
	$(GO) test -run '^$$' -fuzz '^FuzzDistinctUnmarshal$$' $(FUZZFLAGS) ./sketch/
	$(GO) test -run '^$$' -fuzz '^FuzzParse$$' $(FUZZFLAGS) ./rules/
	$(GO) test -run '^$$' -fuzz '^FuzzLoadIPToASN$$' $(FUZZFLAGS) ./detector/enrich/
	$(GO) test -run '^$$' -fuzz '^FuzzForUserAgent$$' $(FUZZFLAGS) ./detector/enrich/

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...
