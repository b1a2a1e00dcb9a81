"""The controller's REST API (FastAPI) and the ASGI server that binds it to a controller.

``app`` assembles the API; ``routes/`` holds one module per OpenAPI tag; ``access``
decides who may call what (and bounds bodies) before any body is read; ``errors`` and
``field_messages`` give every failure one JSON shape; ``models`` holds request bodies;
``exposure`` says at start who may call the API and refuses an open one on the network;
``server`` runs the controller with the app. It must never touch Redis keys itself: all
state lives in ``controlplane.service``.
"""
