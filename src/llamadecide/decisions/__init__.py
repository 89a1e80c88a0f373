"""Decisions: question types, the versioned prompt format, exact option scoring."""

from llamadecide.decisions.prompt import PROMPT_FORMAT_VERSION
from llamadecide.decisions.questions import Option, Question, choice, predicate, score
from llamadecide.decisions.service import Answer, Decider, Decision, OptionScore, Scoring

__all__ = [
    "PROMPT_FORMAT_VERSION",
    "Answer",
    "Decider",
    "Decision",
    "Option",
    "OptionScore",
    "Question",
    "Scoring",
    "choice",
    "predicate",
    "score",
]
