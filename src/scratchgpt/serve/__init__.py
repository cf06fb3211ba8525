"""``scratchgpt serve``: an OpenAI-compatible HTTP server with continuous batching, and a web
playground that shows what the model does.

    batch.py      ContinuousBatch: rows join between decode steps and leave when done (the
                  shared cache's layout: left padding, trimming, sliding), Job and its events
    engine.py     Engine: the one thread that runs the model; bounded queue, cancellation,
                  deadlines, side calls
    protocol.py   OpenAI's request fields (checked) and response shapes; ApiError; Limits
    service.py    requests -> jobs, tokens -> text (stop strings, logprobs), whole and streamed
    reply.py      ReplyText: a chat reply cut short without the start of a template marker
                  (``scratchgpt chat`` prints its replies through it too)
    app.py        the Starlette application: routes, API key, body limit, server-sent events
    attention.py  attention maps for the playground
    metrics.py    Prometheus text
    server.py     ServeConfig, load_service, run_server, BackgroundServer (tests, benchmarks)
    static/       the playground: plain HTML, JavaScript and CSS, no network needed
"""
