"""The backend's services: what the routes call, created once per app (`BackendServices`).

Route modules under `backend/routes/` hold the HTTP surface; the logic they call lives here and
reaches them through the typed providers of `backend/deps.py`.
"""
