FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY webapp webapp
COPY trainer trainer
COPY syncd syncd
COPY bench bench
COPY templates templates
COPY manage.py ./
RUN pip install --no-cache-dir -e .
EXPOSE 8000
