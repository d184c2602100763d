# sluice: `make test` installs what the tests need, then runs every test.
GO ?= go

.PHONY: test deps build replay fuzz bench

test: deps
	$(GO) vet ./...
	$(MAKE) fuzz
	$(GO) test -race -count=1 ./...

deps:
	./deploy/ci/deps.sh

build:
	$(GO) build -o sluice ./cmd/sluice

replay:
	$(GO) run ./cmd/sluice replay

# A short run of every fuzzer (decoders and parsers), as CI does.
FUZZTIME ?= 5s
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzDecode$$' -fuzztime $(FUZZTIME) ./pipeline/
	$(GO) test -run '^$$' -fuzz '^FuzzParseLine$$' -fuzztime $(FUZZTIME) ./pipeline/accesslog/
	$(GO) test -run '^$$' -fuzz '^FuzzCountMinUnmarshal$$' -fuzztime $(FUZZTIME) ./sketch/
	$(GO) test -run '^$$' -fuzz '^FuzzDistinctUnmarshal$$' -fuzztime $(FUZZTIME) ./sketch/
	$(GO) test -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $(FUZZTIME) ./rules/
	$(GO) test -run '^$$' -fuzz '^FuzzLoadIPToASN$$' -fuzztime $(FUZZTIME) ./detector/enrich/
	$(GO) test -run '^$$' -fuzz '^FuzzForUserAgent$$' -fuzztime $(FUZZTIME) ./detector/enrich/

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...
