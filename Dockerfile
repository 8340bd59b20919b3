# idem as a small, non-root container: `idem serve` on the embedded file
# store in the volume /data, every store and broker built in.
#
#   docker build -t idem .
#   docker run -d -p 7700:7700 -v idem-data:/data idem
#   docker run --rm idem consume --from … --to … --store …   (any command)
#
# Settings come from IDEM_* variables or flags (idem serve --help).

ARG RUST_VERSION=1.95

FROM docker.io/library/rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
COPY . .
# librdkafka and zlib are linked in: the runtime image has neither.
ENV LIBZ_SYS_STATIC=1 CARGO_INCREMENTAL=0
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p idem-server --features full \
 && install -m 0755 target/release/idem /usr/local/bin/idem
# The data directory the volume starts from, owned by the runtime user; the
# manual pages and completions, for whoever copies them out.
RUN install -d -o 65532 -g 65532 /data \
 && idem man --dir /usr/local/share/man/man1 \
 && install -d /usr/local/share/idem/completions \
 && for shell in bash zsh fish; do \
      idem completions "$shell" > "/usr/local/share/idem/completions/idem.$shell"; \
    done

# glibc, libgcc, CA certificates and nothing else: no shell, no package
# manager. The nonroot user is 65532.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /usr/local/bin/idem /usr/local/bin/idem
COPY --from=build /usr/local/share/man/man1 /usr/local/share/man/man1
COPY --from=build /usr/local/share/idem /usr/local/share/idem
COPY --from=build --chown=65532:65532 /data /data
USER 65532:65532
ENV IDEM_LISTEN=0.0.0.0:7700 \
    IDEM_STORE=file:///data \
    IDEM_LOG=info
VOLUME ["/data"]
EXPOSE 7700
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
    CMD ["/usr/local/bin/idem", "health", "--url", "http://127.0.0.1:7700/readyz"]
ENTRYPOINT ["/usr/local/bin/idem"]
CMD ["serve"]
