"""Requests and jobs made as the interfaces make them, for tests that drive the loops and the engine directly."""

from minigpt.requests.request import check_options, make_request


def new_request(model, prompt_ids, max_new_tokens=40, **options):
    """A Request as minigpt.generate makes it: the options checked, then the prompt against the model."""
    return make_request(model, prompt_ids, check_options({**options, "max_new_tokens": max_new_tokens}),
                        truncation_offered="truncate_prompt" in options)


def submitted(engine, request, prompt_logprobs=False):
    """A checked request's job, queued on the engine."""
    [job] = engine.jobs_for([request], [prompt_logprobs])
    engine.submit([job])
    return job
