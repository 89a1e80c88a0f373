"""Decisions: question types, the versioned prompt formats, exact option scoring."""

from llamadecide.decisions.answers import Answer, Decision, OptionScore
from llamadecide.decisions.decider import Decider, DecisionInput
from llamadecide.decisions.measuring import Measurer
from llamadecide.decisions.prompt import PROMPT_FORMAT_VERSION
from llamadecide.decisions.questions import Option, Question, choice, predicate, score
from llamadecide.decisions.scoring import Demonstration, Head, Scoring
from llamadecide.decisions.work import Limits

__all__ = [
    "PROMPT_FORMAT_VERSION",
    "Answer",
    "Decider",
    "Decision",
    "DecisionInput",
    "Demonstration",
    "Head",
    "Limits",
    "Measurer",
    "Option",
    "OptionScore",
    "Question",
    "Scoring",
    "choice",
    "predicate",
    "score",
]
