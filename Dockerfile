# The seckill server image (used by docker-compose.yml).
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin seckill

FROM debian:bookworm-slim
COPY --from=build /src/target/release/seckill /usr/local/bin/seckill
USER nobody
EXPOSE 8080
ENTRYPOINT ["seckill"]
CMD ["serve"]
