"""`python -m app.streams`: the stream consumer (see app.streams.process)."""

from app.streams.process import main

main()
