"""capseal.judge.interpret — reading verdicts, placeholder while the package is built."""
