"""The controller's REST API (FastAPI) and the ASGI server that binds it to a controller.

Owns routes, request and response models, authentication and the JSON error shape. It
must never touch Redis keys itself: all state lives in ``controlplane.service``.
"""
