# sluice: `make test` installs what the tests need, then runs every test.
GO ?= go

.PHONY: test test-norace-replay test-norace-rest deps build sidecar replay fuzz fault bench bench-rls release image image-test notices

# The release being prepared (CHANGELOG.md): release artifacts and the image
# carry it, and deploy/kubernetes names the image by it.
VERSION ?= v0.1.0
# What a binary says it is: VERSION only when HEAD is tagged so, else
# VERSION-dev; the commit with -dirty when the tree has uncommitted changes.
BUILD_VERSION := $(shell git describe --tags --exact-match --match '$(VERSION)' 2>/dev/null || echo '$(VERSION)-dev')
COMMIT := $(shell git describe --always --dirty --abbrev=40 --match 'no-tag-matches-this' 2>/dev/null)
LDFLAGS_VERSION = -X main.version=$(BUILD_VERSION) -X main.commit=$(COMMIT)
IMAGE ?= ghcr.io/sluice-rl/sluice:$(VERSION)

# go test's own timeout is 10 minutes per test binary. On a loaded machine (load 10 to 13: two make tests
# and a go build loop) the replays' evaluation alone took 9 min 29 s and timed out; the long runs without
# the race detector get 30 minutes (CI has 90 for all), the race run 20.
LONG = -timeout 30m

test: deps
	$(GO) vet ./...
	cd deploy/check && $(GO) vet ./...
	$(GO) vet -tags nocharts ./cmd/sluice/
	$(GO) build -tags nocharts -o /dev/null ./cmd/sluice
	$(GO) build -tags nocharts,sidecar,grpcnotrace -o /dev/null ./cmd/sluice
	$(MAKE) fuzz
	$(GO) test -race -count=1 -timeout 20m -skip '^($(NORACE_TESTS)|TestClusterWithReplicas|TestFaultLoad|TestFaultLoadKafka|TestStarvedSidecar|TestRedisOutageThreeSidecars)$$' $(RACE_FIRST) ./...
	$(GO) test -race -count=1 -run '^TestClusterWithReplicas$$' ./internal/redistest/
	$(MAKE) --no-print-directory -j2 --output-sync=target test-norace-replay test-norace-rest
	$(MAKE) fault

# The race run's packages, longest first: go test starts packages' runs in the order they are named
# (./... after them adds the rest, each once), 2 at a time on 2 cores; in ./...'s alphabetical order
# replay (about 210 s) started only when cmd/sluice (then about 290 s) was ending, and ran last, mostly alone.
RACE_FIRST = ./cmd/sluice/ ./replay/ ./enforcer/ ./sketch/ ./analytics/ ./detector/
# The tests the race run skips and the two test-norace-* targets run without the race detector (the
# comments below say why, one by one).
NORACE_REPLAY = TestEvalInjectedScenarios|TestEvalRealLogs|TestEvalRealLogsCrawlerRanges|TestEvalRotatingProber|TestReplayClickHouseDown|TestReplayElasticAccountsForEveryLine|TestReplayGeneratedScenario
NORACE_TESTS = $(NORACE_REPLAY)|TestThunderingHerd|TestGlobalQuotaSimulation|TestDocsBlocks|TestEvalCommand|TestReplayBackendFlags|TestReplayHTMLFlag|TestCRSNativeAgreesWithCoraza|TestHyperLogLogSeeds

# make test runs these two side by side (make -j2, each one's output in one piece): the replays'
# evaluation uses about one core (its replays wait at barriers: 220 s of wall time for 227 s of CPU
# at load 4), and the rest (about 70 s in all) takes the other: 171 s for the pair from a clean clone,
# where one after the other they took 265 s. (Measured before the rest had TestReplayMemoryBounded,
# 2 to 3 minutes alone, which makes the two sides about even.)
test-norace-replay:
	$(GO) test -count=1 $(LONG) -run '^($(NORACE_REPLAY))$$' ./replay/

test-norace-rest:
	$(GO) test -count=1 $(LONG) -run '^(TestDocsBlocks|TestEvalCommand|TestReplayBackendFlags|TestReplayHTMLFlag)$$' ./cmd/sluice/
	$(GO) test -count=1 -run '^TestThunderingHerd$$' ./enforcer/backoff/
	$(GO) test -count=1 -run '^TestCRSNativeAgreesWithCoraza$$' ./detector/
	$(GO) test -count=1 -run '^TestHyperLogLogSeeds$$' ./sketch/
	$(GO) test -count=1 -run '^TestGlobalQuotaSimulation$$' -v ./replay/sim/
	$(GO) test -count=1 $(LONG) -run '^TestReplayMemoryBounded$$' -v ./replay/
	cd deploy/check && $(GO) test -count=1 ./...

# deploy/check is a module of its own (the manifest, alert and dashboard checks, with Prometheus's
# server packages, k8s.io/api and kustomize, which the main go.mod thus lacks), so ./... above neither
# vets nor tests it: both are run in it. Its tests run without the race detector: the sluice
# processes they check are a binary they build, the library constructors they call run under -race
# in their own packages' tests, and building Prometheus and k8s.io under -race takes some 5 minutes
# on a cold cache (the tests take about 20 s without it).
# TestEvalInjectedScenarios (the detector on 890 000 injected and background requests, the 10 eval
# scenarios, about 4 min against a redis-server), TestEvalRealLogs (the four real logs, the NASA day
# included) and TestEvalRotatingProber (a scenario file over the busiest 45 minutes of two real logs in 3 orders, about 10 s)
# run without the race detector, which would slow them tenfold; the stages they drive run under -race in their own tests.
# The three run in parallel (the real logs' replays wait at barriers): 2.5 min in all at load 5, 3.5 min one after another.
# TestEvalRealLogsCrawlerRanges checks the rules of the very replay of SecRepo's 2018 log that
# TestEvalRealLogs judges (realLogReport replays each log once per test binary): it runs beside it,
# where that replay costs it nothing, and not under the race detector, where it replayed the log again
# on its own (56 s of the race run); the replay and detector code runs under -race in replay's other tests
# (TestReplaySecRepoEndToEnd replays the same log).
# TestReplayGeneratedScenario (the quick start's replay, three times: 20 000 decisions each, CPU-bound)
# runs without it too: under it, 53-65 s a replay at load 5-9 and 167 s at load 12-15, 500 s in all, which
# put the race run's replay package near its 20 minutes; TestReplaySecRepoEndToEnd and the package's other
# tests run the same stages under -race.
# TestGlobalQuotaSimulation (5 redis-servers, kfake, the pipeline and 84 000 decisions on simulated
# time, twice) runs without the race detector: about 10 s without it, some 40 s under it alone and more
# beside the other packages; the enforcer, pipeline, applier and aggregator it drives run under -race in their
# own tests. -v prints its report (docs/benchmarks.md).
# TestReplayElasticAccountsForEveryLine (the 10 000-line Elastic log replayed whole) runs beside them
# without it too: 247 s of the race run at load 15; the parser and stages it drives are under -race in
# replay/accesslog's and replay's other tests.
# TestReplayMemoryBounded (200 000 generated lines, about 2 to 3 minutes; the heap in use while
# running and after a GC, against caps) runs without it, and skips itself under it: the race detector
# would slow it tenfold and its heap figures would not be the replay's. It runs in a process of its own
# (in test-norace-rest, beside the evaluation's replays), so that no other test's heap is counted in
# its figures; the code it drives runs under -race in replay's other tests (TestRunLetsItsPartsGo).
# TestReplayClickHouseDown (a replay during which ClickHouse is killed for 30 s, about 40 s) runs
# without it for the same reason, in parallel with the evaluation's replays; the sink runs under -race in analytics.TestClickHouseDown, which
# also stops ClickHouse for 30 s (the analytics package takes about 50 s under -race).
# TestDocsBlocks runs every command of the docs with the test binary as sluice (24 commands, a real-log
# replay among them): without the race detector, which made it 84 s and the README's replay pass its
# timeout; the code those commands run is under -race in its packages' tests.
# TestEvalCommand, TestReplayBackendFlags and TestReplayHTMLFlag (sluice eval and replay end to end,
# whole replays) run beside it without the race detector for the same reason: under it they took 180,
# 120 and 70 s of the race run and missed their own deadlines at load 14; the replay, detector and
# backend code they drive runs under -race in replay's and detector's tests. -timeout 20m: cmd/sluice
# and replay take 9 minutes under -race on 2 cores, close to go test's default of 10.
# cmd/sluice's TestCrowdSecBouncer stops a CrowdSec Local API for the issue's full 60 s while it checks
# sluice serve (-crowdsec.outage=10s shortens it locally); it runs in parallel with
# TestCrowdSecAlertsFromReplay (a replay, about 45 s under -race), so the two add about 70 s to cmd/sluice.
# cmd/sluice's tests that mostly wait on their own servers (TestPipelineCommand, TestPipelineKilledMidStream,
# TestServeAdaptiveLimitsFollowAccessLog, TestServeUnreadyWhileKafkaIsDown) run in parallel with these two,
# at go test's default -parallel (GOMAXPROCS, 2 here): cmd/sluice alone under -race took 226 s at load 2-5
# (292 s before, load 3-6; TestLocalStack then still beside them). -parallel 8 was
# no faster (200 s, load 15) and starved TestLocalStack's enforcers, which therefore runs on its own.
# TestClusterWithReplicas (a CLUSTER FAILOVER in a 6-node Cluster) runs on its own, after the race
# run and before the test-norace-* pair: with every package's tests beside it, Redis's coordinated failover timed out (5 s) twice in a
# row, while alone it takes under a second.
# TestCRSNativeAgreesWithCoraza (7 500 requests through Coraza and the native CRS evaluator, about 12 s)
# runs without the race detector, under which Coraza's evaluations take 4 minutes; the evaluator runs
# under -race in the detector's other tests.
# TestHyperLogLogSeeds (the sketches' error over 1 000 seeded sets, one goroutine, CPU only) runs
# without the race detector, which cannot find a race in one goroutine and made it 46 s of the race
# run (3 s without); HLL and Distinct run under -race in sketch's other tests (TestDistinctMerge,
# TestHLLRange, the rings' tests).
# TestThunderingHerd runs without the race detector: its 1 000 clients' timers
# in one testing/synctest bubble crash Go 1.26.8's runtime under -race (SIGSEGV
# in runtime.(*timer).maybeRunChan, about once in 30 runs; never without -race
# in 90). The Transport's other tests, synctest ones included, run under -race.

# The fault tests under load (enforcer.TestFaultLoad, the Redis faults and failovers, about 2½ minutes,
# and internal/faultload.TestFaultLoadKafka, Kafka down, about 80 s; the harness is internal/faultload,
# and the Kafka case is its own test because enforcer's tests may not import pipeline), alone on the
# machine so that other packages' tests do not take its cores: at their default 2 000 requests/s
# without the race detector (which slows the code it watches tenfold), the Redis cases 20 s each here
# (the default is 30 s: 4 s healthy, 12 s faulted, 5 s healed still hold a dozen breaker cool-downs and
# probes; the ten seconds a case saved bring make test under 20 minutes), the Kafka case at its 30 s
# (Kafka down 60 s: with 20 s, in one run at load 10, the producer had failed no record by the 40 s
# outage's end, which the case's check of a loss past the 30 s delivery timeout then failed),
# then one case of
# each kind (proxy, failover, Kafka) briefly under it (the Redis cases 5 s: with 3 s, the fault's 1.8 s
# window held too few decisions for the checks' 10% allowance for those in flight at its ends, since
# under the race detector a blackholed decision waits up to 390 ms; 482 counted of the 486 wanted once).
# Every open-loop case offers the highest of -fault.rate, half of it, ... (250 at least) that a
# calibration second shows the machine carries now, to the sidecar under the fault and to a control
# beside it whose Redis and Kafka stay healthy, runs again at half the rate when its control falls
# behind (the machine got busier), and judges the faulted sidecar against the control: a loaded machine
# (load 15) made the fixed 2 000 requests/s pile up in both and fail the run for no defect. The
# closed-loop cases run again at twice the budget (up to 40 ms) when a breaker opened with Redis healthy.
# One package per go test, so that they do not run at once.
# cmd/sluice's TestStarvedSidecar (sluice serve processes held to a quarter of a core by a cgroup CPU
# quota the test makes, a healthy redis-server: 1 000 keys, 10 keys and the Kong scenario) and
# TestRedisOutageThreeSidecars (three sidecars, a redis-server killed under load for 20 s and restarted
# empty) take their -starve.duration (20 s) of real time each; run as this test binary built without
# the race detector (the processes are `sluice serve`), the four cases in parallel (-parallel 4: each
# has its own sidecars, cgroup and Redis), about 40 s. They skip, saying why, where no cgroup CPU
# controller is writable (not root). Shorten locally with -starve.duration=5s -starve.runs=5. The race run
# above skips them: they starve processes of their own, which need the machine to themselves.
# Locally, shorten them: go test ./enforcer/ -run TestFaultLoad -fault.duration=5s (the package before
# the suite's own flags, which go test passes on with everything after them); likewise
# go test ./internal/faultload/ -run TestFaultLoadKafka -fault.duration=5s.
fault:
	$(GO) test -count=1 $(LONG) -run '^TestFaultLoad$$' ./enforcer/ -fault.duration=20s
	$(GO) test -count=1 $(LONG) -run '^TestFaultLoadKafka$$' ./internal/faultload/
	$(GO) test -count=1 $(LONG) -parallel 4 -run '^(TestStarvedSidecar|TestRedisOutageThreeSidecars)$$' ./cmd/sluice/
	$(GO) test -race -count=1 ./enforcer/ -run '^TestFaultLoad$$/^(redis-blackhole|failover-sentinel)$$' \
		-fault.duration=5s -fault.rate=300
	$(GO) test -race -count=1 ./internal/faultload/ -run '^TestFaultLoadKafka$$' \
		-fault.duration=3s -fault.rate=300

deps:
	./deploy/ci/deps.sh

build:
	$(GO) build -trimpath -ldflags='-s -w $(LDFLAGS_VERSION)' -o sluice ./cmd/sluice

# The binary for the sidecar: sluice serve and sluice rules only (-tags sidecar: no replay, pipeline
# or ClickHouse commands, and with them no in-process Kafka or Redis and no ClickHouse client) and
# without replay --html's charting stack (-tags nocharts), without gRPC's x/net/trace (-tags
# grpcnotrace: its html/template kept 12 MB of otherwise dead code), stripped; at most 35 MB
# (TestSidecarBuild). docs/benchmarks.md, "Binary size".
sidecar:
	$(GO) build -tags nocharts,sidecar,grpcnotrace -trimpath -ldflags='-s -w $(LDFLAGS_VERSION)' -o sluice-sidecar ./cmd/sluice

# Static binaries (no cgo) for linux/amd64 and linux/arm64, the full one and
# the sidecar's, in dist/ with LICENSE, THIRD_PARTY_NOTICES and SHA256SUMS. About 3 minutes on 2 cores.
RELEASE_PLATFORMS = linux/amd64 linux/arm64
release:
	rm -rf dist && mkdir -p dist
	set -e; for p in $(RELEASE_PLATFORMS); do \
		os=$${p%/*}; arch=$${p#*/}; \
		CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch $(GO) build -trimpath -ldflags='-s -w $(LDFLAGS_VERSION)' \
			-o dist/sluice-$(VERSION)-$$os-$$arch ./cmd/sluice; \
		CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch $(GO) build -tags nocharts,sidecar,grpcnotrace -trimpath -ldflags='-s -w $(LDFLAGS_VERSION)' \
			-o dist/sluice-sidecar-$(VERSION)-$$os-$$arch ./cmd/sluice; \
	done
	cp LICENSE THIRD_PARTY_NOTICES dist/
	cd dist && sha256sum sluice-* LICENSE THIRD_PARTY_NOTICES > SHA256SUMS && cat SHA256SUMS

# THIRD_PARTY_NOTICES: the licences and notices of every module linked into sluice, shipped with the
# release binaries and in the image; TestThirdPartyNoticesCurrent fails when go.mod moves without it.
notices:
	GO=$(GO) ./deploy/release/notices.sh > THIRD_PARTY_NOTICES

# The OCI image (Dockerfile) with buildah, tagged $(IMAGE); deploy/image/build.sh
# says how it finds a Go base without a registry. image-test runs it with podman
# against a redis-server on the host's loopback (deploy/image/test.sh).
image:
	IMAGE=$(IMAGE) VERSION=$(BUILD_VERSION) COMMIT=$(COMMIT) ./deploy/image/build.sh

image-test: image
	IMAGE=$(IMAGE) ./deploy/image/test.sh

replay:
	$(GO) run ./cmd/sluice replay

# A short run of every fuzzer (decoders and parsers), as CI does. The budget
# is a count of executions, not a duration: with a duration, Go 1.26's fuzzing
# coordinator can fail a run that found nothing with "context deadline
# exceeded" as the time runs out (golang/go#75804, fixed in Go 1.27; seen here
# on FuzzForUserAgent). 20 000 executions take 0.2 to 15 s per fuzzer.
FUZZTIME ?= 20000x
# Minimizing a new interesting input may otherwise take up to 60 s.
FUZZFLAGS = -fuzztime $(FUZZTIME) -fuzzminimizetime 1s
# Each fuzzer as Name@package; a run prints its output only when it fails.
FUZZERS = \
	FuzzDecode@./decision/ \
	FuzzParseLine@./replay/accesslog/ \
	FuzzCountMinUnmarshal@./sketch/ \
	FuzzDistinctUnmarshal@./sketch/ \
	FuzzCountMinRingUnmarshal@./sketch/ \
	FuzzEWMAUnmarshal@./sketch/ \
	FuzzEntropyUnmarshal@./sketch/ \
	FuzzHLLRingUnmarshal@./sketch/ \
	FuzzHLLUnmarshal@./sketch/ \
	FuzzMADUnmarshal@./sketch/ \
	FuzzTopKUnmarshal@./sketch/ \
	FuzzSpreadUnmarshal@./sketch/ \
	FuzzPartialRecords@./pipeline/stage/ \
	FuzzDecodeOutputRecord@./pipeline/ \
	FuzzDecodeQuotaRecord@./pipeline/gcounter/ \
	FuzzParse@./rules/ \
	FuzzParseEnvoy@./rules/ \
	FuzzMatch@./rules/ \
	FuzzNormalizePath@./rules/ \
	FuzzDynamicRuleJSON@./rules/ \
	FuzzLoadIPToASN@./detector/enrich/ \
	FuzzForUserAgent@./detector/enrich/ \
	FuzzClusterPartial@./detector/ \
	FuzzEntropyPartial@./detector/ \
	FuzzContentPartial@./detector/ \
	FuzzCRSNativeAgreesWithCoraza@./detector/ \
	FuzzNewIdentitiesPartial@./detector/ \
	FuzzSharesPartial@./aggregator/ \
	FuzzParseHeaders@./enforcer/backoff/ \
	FuzzCheckJSON@./enforcer/sidecar/ \
	FuzzBatchAdd@./analytics/ \
	FuzzDecision@./crowdsec/
# FUZZJOBS fuzzers run at a time: one uses about 1.1 of 2 cores (its workers wait on the
# coordinator), so two run at a time (123 s for all, at load 4 to 8, against about 180 s one at a time); the budget is a count, so a fuzzer's
# result does not depend on the cores it gets. A failing fuzzer stops the rest (xargs on exit 255).
FUZZJOBS ?= 2
fuzz:
	@printf '%s\n' $(FUZZERS) | xargs -P $(FUZZJOBS) -n 1 sh -c '\
		name=$${1%%@*}; pkg=$${1#*@}; \
		echo "fuzz $$name $$pkg"; \
		out=$$($(GO) test -run "^\$$" -fuzz "^$$name\$$" $(FUZZFLAGS) $$pkg 2>&1) || { echo "$$out"; exit 255; }' sh

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...

# The request path end to end: sluice serve's Envoy RLS v3 gRPC against its own redis-server, driven
# by shared/tools/rlsload, medians over interleaved rounds as a markdown table (ROUNDS, WORKERS,
# DESCS, DURATION, WARMUP, SERVE_FLAGS, OUT, DENY=1 for deny accuracy: see the script's header).
# About 4 minutes with the defaults (3 rounds of 6 runs of 12 s).
bench-rls:
	GO=$(GO) ./deploy/bench/rls.sh
