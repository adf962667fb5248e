"""User entry points: the offline ``LLM`` class, the OpenAI server and the CLI."""
