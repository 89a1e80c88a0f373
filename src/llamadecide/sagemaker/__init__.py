"""The SageMaker edge: /ping, /invocations, the SM_* environment, the serving entrypoint."""
