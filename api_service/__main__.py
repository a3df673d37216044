from api_service.main import main

main()
