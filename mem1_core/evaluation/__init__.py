"""Evaluation: answer scoring, running and summarising evaluations, objective scaling."""
