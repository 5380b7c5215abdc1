from evaluation.report.figures.build import main

main()
