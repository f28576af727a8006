"""The console's pages: one module per family, each with a `register(router)`.

Every handler gathers its data from `Sources` and renders one Jinja2 template
(autoescaped). A page whose sources fail shows what it could read and says
what it could not; a bad request (a malformed id, an unknown group) is a 4xx
page from the error middleware in `api`.
"""
