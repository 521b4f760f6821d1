"""Loading the weights: a Hub id, a local directory, a GGUF file or a published shape's dummy
weights, into the core's Llama (``loader``), and the bytes those weights weigh (``weight_bytes``).
Imports the core and the root leaves; never a wing, the build, the instruments or the course.
"""
