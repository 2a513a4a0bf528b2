# The provider's runner (providers/runner, no Django), built with no registry FROM the
# local base of scripts/build-python-base-image.sh. From the repository root:
#   docker build --network none -f deploy/docker/runner.Dockerfile -t gpumarket/runner .
# It starts leases as sibling containers: mount the Docker socket and the state dir, e.g.
#   docker run -v /var/run/docker.sock:/var/run/docker.sock -v /var/lib/gpumarket-runner:/state \
#     --gpus all gpumarket/runner run --state-dir /state
# (register once with `… gpumarket/runner register --url … --token … --state-dir /state`).
# Exit status 3: the token was refused; restart policy on-failure retries it in vain.
ARG BASE=gpumarket/python-base:local
FROM ${BASE}
WORKDIR /app
COPY providers providers
ENV GPUMARKET_RUNNER_STATE_DIR=/state
ENTRYPOINT ["python", "-m", "providers.runner"]
CMD ["run", "--state-dir", "/state"]
