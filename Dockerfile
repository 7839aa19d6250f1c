# The Hugging Face Space (README's front matter: sdk docker): one build step, scripts/space_build.sh,
# the same one scripts/setup.sh runs and tests/test_space.py checks, so the Space answers from the
# GGUF weights every number in docs/ was measured on.
FROM python:3.11-slim
RUN useradd -m -u 1000 user
WORKDIR /home/user/app
COPY --chown=user . .
RUN scripts/space_build.sh
USER user
ENV HOME=/home/user GRADIO_ANALYTICS_ENABLED=False
EXPOSE 7860
CMD ["python", "app.py", "--host", "0.0.0.0", "--port", "7860"]
