"""The HTTP door: REST and KServe v2 over flask-smorest, OpenAPI at /openapi.json,
Swagger UI at /docs (app.web.api), errors as RFC 9457 problem+json (app.web.problems,
whose types are app.web.problem_types). Nothing is imported here, so the stream
door can read the problem types without loading Flask."""
