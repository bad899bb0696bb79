"""Layer 7, the front ends: ``python -m lit_ppo fit|validate|test|export|compare|sweep``. Each
subcommand parses and checks its arguments, reports a mistake as one line (exit code 2) and calls the
layers below; nothing below imports from here."""
