"""What the tests hand megacache and the oracles: text corpora and tokenized references
(``corpus``), indexed datasets of given sequence lengths (``indexed``), many small shards
(``shards``), real tokenizer files (``tokenizer_files``), tokenizer flag sets (``tokenizer_cases``)
and training commands as users write them (``training_command``)."""
