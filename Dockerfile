FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 STARTSAFE_VAR_DIR=/app/var
WORKDIR /app
# Dependencies first, so a code change does not reinstall them.
COPY pyproject.toml README.md ./
COPY startsafe ./startsafe
COPY runs ./runs
COPY approvals ./approvals
RUN pip install --no-cache-dir .
COPY . .
# Not root: celery warns about it, and nothing here needs it.
RUN useradd --create-home --uid 1000 app && mkdir -p /app/var && chown -R app /app/var
USER app
EXPOSE 8000
CMD ["gunicorn", "startsafe.wsgi:application", "--bind", "0.0.0.0:8000", "--workers", "4"]
