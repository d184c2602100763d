# sluice's OCI image: the sidecar's binary (built with -tags nocharts: every
# subcommand but replay --html's charts) on an empty base, run as a non-root
# user. Build it with `make image` (buildah, no daemon; see deploy/image/build.sh)
# or with any builder: `podman build .`, `docker build .`.
#
# GO_IMAGE is the build stage's base: a Go 1.26 toolchain with a CA bundle at
# /etc/ssl/certs/ca-certificates.crt. The default is Docker Hub's official
# image; `make image` on a machine without a registry builds a local one from
# the host's toolchain instead (localhost/sluice-go, deploy/image/go-base.sh).
ARG GO_IMAGE=docker.io/library/golang:1.26-bookworm

FROM ${GO_IMAGE} AS build
ENV CGO_ENABLED=0 GOFLAGS=-trimpath GOCACHE=/tmp/gocache GOPATH=/tmp/gopath
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# The build context has no .git (.dockerignore): the version and commit come
# from the builder (make image passes git's).
ARG VERSION=""
ARG COMMIT=""
RUN go build -buildvcs=false -tags nocharts \
	-ldflags "-s -w -X main.version=${VERSION} -X main.commit=${COMMIT}" \
	-o /out/sluice ./cmd/sluice

FROM scratch
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /out/sluice /usr/local/bin/sluice
COPY --from=build /src/LICENSE /src/THIRD_PARTY_NOTICES /usr/share/doc/sluice/
ARG VERSION
ARG COMMIT
LABEL org.opencontainers.image.title="sluice" \
	org.opencontainers.image.description="sluice: a distributed API rate limiter (Envoy RLS v3 sidecar)" \
	org.opencontainers.image.licenses="Apache-2.0" \
	org.opencontainers.image.source="https://github.com/sluice-rl/sluice" \
	org.opencontainers.image.version="${VERSION}" \
	org.opencontainers.image.revision="${COMMIT}"
# 65532: the "nonroot" user of distroless images; no shell, no passwd file.
USER 65532:65532
# serve's probes and metrics (--admin-http, every interface); its HTTP API (/v1/check,
# forward-auth, /v1/usage) and Envoy's RLS gRPC listen on the container's loopback unless
# --http and --grpc say otherwise (docs/forward-auth.md, "Listeners").
EXPOSE 8082 8080 8081
ENTRYPOINT ["/usr/local/bin/sluice"]
CMD ["serve"]
