from evaluation.figures.build import main

main()
