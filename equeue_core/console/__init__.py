"""The web console (`equeue console`): Starlette pages over the admin client; see app.py."""
