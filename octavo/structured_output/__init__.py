"""Structured outputs: constrain generation to a JSON Schema, regex, choice, EBNF grammar or
structural tag, with xgrammar.

- ``grammar``: a request's ``StructuredOutputsParams`` -> an xgrammar ``Grammar`` (parsing only:
  cheap, used by the input processor to refuse a bad schema/regex/grammar with a 400);
- ``compiler``: grammars compiled against the tokenizer in a thread pool, off the engine's
  loop, cached by spec (``n > 1`` children and repeated schemas compile once);
- ``request``: the per-request matcher, advanced with every accepted token;
- ``manager``: what the engine core calls: attach a request, collect the batch bitmask of
  the requests that sample this step.

The sampler applies the bitmask (``octavo.core.sampler.apply_token_bitmask``) as one
vectorised op over the batch, on whatever device the logits are on.
"""
