"""HTTP routes of the backend, one router per area (`create_app` includes them)."""
