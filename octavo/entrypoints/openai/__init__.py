"""The OpenAI-compatible server (``octavo serve``): FastAPI app, protocol models, serving code."""
