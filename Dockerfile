FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY startsafe ./startsafe
COPY runs ./runs
COPY approvals ./approvals
RUN pip install --no-cache-dir .
COPY . .
EXPOSE 8000
