"""An importable app for the app-loading tests."""

import leasework

app = leasework.App("good")


@app.job("good.hello")
async def hello(ctx):
    return "hi"


other = leasework.App("other")


@other.job("good.hello")  # the same name as in `app`: merging the two must fail
async def hello_again(ctx):
    return "hi again"


not_an_app = 42
