# The marketplace (web, worker, beat: one image, three commands), built with no registry
# FROM the local base of scripts/build-python-base-image.sh. From the repository root:
#   docker build --network none -f deploy/docker/marketplace.Dockerfile -t gpumarket/marketplace .
# Web:    docker run … gpumarket/marketplace                     (uvicorn on :8000)
# Worker: docker run … gpumarket/marketplace celery -A marketplace worker -Q market,leases,ledger   (or one queue each)
# Beat:   docker run … gpumarket/marketplace celery -A marketplace beat   (exactly one)
ARG BASE=gpumarket/python-base:local
FROM ${BASE}
WORKDIR /app
COPY manage.py pyproject.toml ./
COPY core core
COPY marketplace marketplace
COPY settlement settlement
COPY frontend frontend
COPY providers providers
COPY webhooks webhooks
COPY alerts alerts
COPY contracts/build contracts/build
ENV DJANGO_SETTINGS_MODULE=marketplace.settings \
    GPUMARKET_VAR_DIR=/var/lib/gpumarket \
    PROMETHEUS_MULTIPROC_DIR=/var/lib/gpumarket/prometheus
# the static files are part of the image (WhiteNoise serves them); a throwaway key
RUN mkdir -p /var/lib/gpumarket/prometheus \
 && SECRET_KEY=collectstatic-only DEBUG=1 \
    python manage.py collectstatic --noinput -v 0 \
 && rm -rf /var/lib/gpumarket/prometheus/* /var/lib/gpumarket/*.sqlite3 /var/lib/gpumarket/secret_key
EXPOSE 8000
CMD ["python", "-m", "uvicorn", "marketplace.asgi:application", "--host", "0.0.0.0", \
     "--port", "8000", "--ws-per-message-deflate", "false", "--proxy-headers"]
